"""kvcli.version: the one version string, the same in pyproject.toml and re-exported by the package."""
from __future__ import annotations

import re
from pathlib import Path

import kvcli
from kvcli.version import __version__

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_names_the_version_the_package_reports():
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]  # the [project] table, up to the next one
    declared = re.search(r'^version = "([^"]+)"$', project, re.MULTILINE)
    assert declared is not None and declared.group(1) == __version__


def test_the_package_reexports_the_leaf_version():
    assert kvcli.__version__ is __version__
