"""The package layout's rules, checked on the source: each subpackage imports only what its ``__init__`` allows,
and no two modules import each other (directly or through a cycle)."""
from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import kvcli

ROOT = Path(kvcli.__file__).parent

# subpackage -> kvcli subpackages (or top-level modules) it may import; mirrors each __init__'s "May import" line.
ALLOWED = {
    "version": set(),  # a leaf: the version string, importable by every module below
    "errors": set(),
    "redact": set(),
    "outfile": {"errors"},  # files a user names for kvcli to write: one writer for every command
    "figures": {"errors", "outfile"},
    "provenance": {"redact", "version"},
    "units": {"errors", "provenance"},
    "tables": set(),
    "prefixkv": {"errors"},
    "model": {"errors", "units", "redact", "provenance", "prefixkv", "version", "outfile"},
    "traces": {"errors", "units", "model", "outfile"},
    "sim": {"errors", "units", "traces"},  # pure simulations, below the store (which takes its LRU from here)
    "store": {"errors", "units", "redact", "prefixkv", "sim"},
    "replay": {"errors", "units", "tables", "figures", "sim", "traces", "store", "model", "prefixkv"},
    "live": {"errors", "units", "tables", "traces", "store", "model", "prefixkv"},
    "route": {"errors", "units", "tables", "figures", "sim", "traces", "store", "model"},
    "analysis": {"errors", "units", "tables", "sim", "traces", "model", "store", "engine"},
    "engine": {"errors", "units", "traces"},
    "html": {"errors", "units", "outfile"},  # the report page: a pure function of the JSON documents
    "cli": {"errors", "units", "redact", "provenance", "figures", "outfile", "tables", "sim", "traces", "store",
            "model", "replay", "live", "route", "analysis", "engine", "html", "version"},
    "__main__": {"cli"},
    "__init__": {"errors", "traces", "store", "replay", "live", "model", "version"},  # its library names, lazily
}


def _imports(path: Path) -> set[str]:
    """Every ``kvcli.x.y`` module a file imports (top level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvcli"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kvcli"))
    return out


def _modules() -> dict[str, Path]:
    return {".".join(("kvcli",) + p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in ROOT.rglob("*.py")}


def test_subpackages_import_only_what_they_may():
    bad = []
    for name, path in _modules().items():
        part = name.split(".")[1] if "." in name else "__init__"
        for imp in _imports(path):
            if imp == "kvcli":
                continue  # the package itself (``from kvcli import provenance``, ``import kvcli`` for its path)
            other = imp.split(".")[1]
            if other != part and other not in ALLOWED[part]:
                bad.append(f"{name} imports {imp}")
    assert bad == []


def test_no_import_cycles():
    modules = _modules()
    graph = {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if modules[nxt].name == "__init__.py":
                continue  # a package __init__ imports nothing at run time (kvcli's own: its names on first use)
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_every_subpackage_says_what_it_owns_and_may_import():
    for init in ROOT.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc or "Imports:" in doc, init


def test_the_simulations_load_neither_redis_nor_a_model():
    """kvcli.sim needs neither Redis nor a model: importing all of its modules in a fresh interpreter loads no
    redis-py, torch or tokenizer library."""
    names = sorted(n for n in _modules() if n.startswith("kvcli.sim."))
    assert "kvcli.sim.curve" in names and "kvcli.sim.lru" in names
    heavy = ("redis", "torch", "transformers", "tokenizers", "tiktoken")
    code = (f"import sys\nfor name in {names!r}:\n    __import__(name)\n"
            f"print(' '.join(sorted(m for m in {heavy!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


SERVER_FIXTURES = {"redis_url", "redis_client", "make_server", "fault_proxy", "server_kind", "cluster_in_background",
                   "_session_server", "_session_cluster", "_flushers"}


def test_the_simulations_tests_start_no_server():
    """tests/sim/ asks for none of conftest.py's server fixtures."""
    files = sorted((Path(__file__).parent / "sim").glob("test_*.py"))
    assert files
    asked = {f"{path.name}:{node.name}({arg.arg})"
             for path in files
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
             for arg in node.args.args if arg.arg in SERVER_FIXTURES}
    assert asked == set()


def _own_names(tree: ast.AST) -> set[str]:
    """Every name a file defines or binds: functions, classes, ``self.x`` / ``cls.x`` attributes, assigned names,
    import aliases, parameters."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            own.update(a.asname or a.name.split(".")[0] for a in node.names)
    return own


def _private_reach(path: Path) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is not defined in the same file, and
    ``from kvcli.x import _name``: another module's private member."""
    tree = ast.parse(path.read_text())
    own, out = _own_names(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvcli"):
            out += [f"{path.name}:{node.lineno}: imports {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
              and node.attr not in own):
            out.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return out


def test_no_module_reaches_into_another_modules_private_members():
    """A module that needs another's ``_name`` is missing a public method or result type (STYLE.md, "Seams")."""
    bad = [hit for path in sorted(ROOT.rglob("*.py")) for hit in _private_reach(path)]
    assert bad == []


def test_the_private_reach_check_can_fail(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from kvcli.store.layout import _KEY_RE\n\ndef f(store):\n    return store._lru, store.prefix\n")
    assert _private_reach(source) == ["m.py:1: imports _KEY_RE", "m.py:4: ._lru"]


DOTTED = re.compile(r"(?<![\w/.-])kvcli(?:\.[A-Za-z_]\w*)+")
SLASHED = re.compile(r"(?<![\w/.-])((?:kvcli|tests|bench)/[\w/-]*\w\.(?:py|md|json|txt|sh))\b")


def _resolves(ref: str) -> bool:
    """Whether ``kvcli.a.b.Name.attr`` names something: its longest importable module prefix, then attributes."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _broken_references(path: Path, repo: Path) -> list[str]:
    """Every ``kvcli.x.y`` reference in ``path`` that names no module or attribute, and every ``kvcli/...``,
    ``tests/...`` or ``bench/...`` file path that does not exist under ``repo``."""
    text, out = path.read_text(), []
    for m in DOTTED.finditer(text):
        if not _resolves(m.group(0)):
            out.append(f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    for m in SLASHED.finditer(text):
        if not (repo / m.group(1)).exists():
            out.append(f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
    return out


def test_every_dotted_reference_in_code_and_docs_resolves():
    """A docstring or doc naming ``kvcli.x.y`` (or a file ``kvcli/x/y.py``) names something that exists."""
    repo = ROOT.parent
    here = Path(__file__).resolve()
    files = [*sorted(ROOT.rglob("*.py")), *sorted((repo / "docs").glob("*.md")), repo / "README.md",
             *sorted(p for p in (repo / "tests").rglob("*.py") if p != here), *sorted((repo / "bench").glob("*.py"))]
    assert [hit for path in files for hit in _broken_references(path, repo)] == []


def test_the_reference_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See kvcli.store.chunkstore.ChunkStore.lookup, kvcli.hashing.chain and kvcli/replay/tiers.py,\n"
                    "and kvcli/store/chunkstore.py, model kvcli/cpu.\n")
    assert _broken_references(page, ROOT.parent) == ["page.md:1: kvcli.hashing.chain",
                                                      "page.md:1: kvcli/replay/tiers.py"]


def test_test_files_have_distinct_names():
    """pytest imports test files by basename (no ``__init__.py`` in tests/): two of one name fail collection."""
    names = [p.name for p in (Path(__file__).parent).rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
