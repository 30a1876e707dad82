"""kvcli's version string, in a module of its own that imports nothing: every module that names the version (the
provenance of a JSON document, a device profile, ``kvcli --version``) imports it from here, never from the package
above it. pyproject.toml's ``version`` is the same string (a test checks that they agree).
"""

__version__ = "0.1.0"
