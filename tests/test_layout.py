"""The package layout's rules, checked on the source: each subpackage imports only what its ``__init__`` allows,
and no two modules import each other (directly or through a cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

import kvcli

ROOT = Path(kvcli.__file__).parent

# subpackage -> kvcli subpackages (or top-level modules) it may import; mirrors each __init__'s "May import" line.
ALLOWED = {
    "errors": set(),
    "redact": set(),
    "figures": {"errors"},
    "provenance": {"redact"},
    "units": {"errors", "provenance"},
    "tables": set(),
    "prefixkv": {"errors"},
    "store": {"errors", "units", "redact", "prefixkv"},
    "model": {"errors", "units", "redact", "provenance", "prefixkv"},
    "traces": {"errors", "units", "model"},
    "replay": {"errors", "units", "tables", "figures", "traces", "store", "model", "prefixkv"},
    "live": {"errors", "units", "tables", "traces", "store", "model", "prefixkv"},
    "route": {"errors", "units", "tables", "figures", "traces", "store", "model"},
    "analysis": {"errors", "units", "tables", "traces", "model", "replay", "store"},
    "engine": {"errors", "units", "traces"},
    "cli": {"errors", "units", "redact", "provenance", "figures", "tables", "traces", "store", "model", "replay",
            "live", "route", "analysis", "engine"},
    "__main__": {"cli"},
    "__init__": {"errors", "traces", "store", "replay", "live", "model"},  # its library names, loaded lazily
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
            if imp in ("kvcli", "kvcli.__version__"):
                continue  # ``from kvcli import __version__``: the package's version string, importable by all
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
