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
    "units": {"errors"},
    "tables": set(),
    "store": {"errors", "units"},
    "model": {"errors", "units"},
    "traces": {"errors", "units", "model"},
    "replay": {"errors", "units", "tables", "traces", "store", "model"},
    "live": {"errors", "units", "tables", "traces", "store", "model"},
    "route": {"errors", "units", "tables", "traces", "store", "model"},
    "cli": {"errors", "units", "tables", "traces", "store", "model", "replay", "live", "route"},
    "__main__": {"cli"},
    "__init__": set(),
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
            if nxt.count(".") == 1 and modules[nxt].name == "__init__.py":
                continue  # a package __init__ holds no code that imports back
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
