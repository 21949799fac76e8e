"""The house rules of the layout (docs/design.md): no import cycle in workbench/ (module-level
or inside functions), no module imports the top package (``import workbench`` / ``from workbench
import load``: an arrow to everything), no library module imports the CLI, no module reads
another workbench module's underscore names."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "workbench"

#: the command-line front: workbench/cli.py itself may import anything
CLI = "workbench.cli"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = mod.split(".") if MODULES[mod].name == "__init__.py" else mod.split(".")[:-1]
    base = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str) -> str | None:
    """The workbench module an imported dotted name lands in (the longest known prefix)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in MODULES:
            return cand
    return None


def _imports(mod: str) -> dict[str, list[tuple[str, int]]]:
    """workbench modules ``mod`` imports (anywhere in the file) -> [(imported name, line)]."""
    tree = ast.parse(MODULES[mod].read_text(), filename=str(MODULES[mod]))
    out: dict[str, list] = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node)
            # ``from workbench.x import y``: y may be a submodule (workbench.x.y) or a name of workbench.x
            names = [f"{base}.{a.name}" if _target(f"{base}.{a.name}") == f"{base}.{a.name}" else base
                     for a in node.names]
        for n in names:
            t = _target(n)
            if t is not None and t != mod and n.startswith("workbench"):
                out.setdefault(t, []).append((n, node.lineno))
    return out


GRAPH = {m: _imports(m) for m in MODULES}


TOP = "workbench"


def _edges(m: str) -> set[str]:
    # importing a.b.c runs the packages a and a.b first (not an arrow of its own); a package's
    # own __init__ is not an arrow from the package to itself; but an explicit ``import
    # workbench`` / ``from workbench import load`` is an arrow to the top package, which
    # reaches everything
    return {t for t in GRAPH[m] if t != m and (t == TOP or not m.startswith(t + "."))}


def test_the_graph_is_read():
    assert "workbench.models.model" in MODULES
    assert any(GRAPH[m] for m in MODULES)
    assert "workbench.program" in _edges("workbench.models")  or any(
        "workbench.program" in _edges(m) for m in MODULES if m.startswith("workbench.models."))


def test_no_import_cycle():
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(_edges(m)):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_top_package_is_counted():
    # a module that imports the top package is read as an arrow to it (and the top package's
    # own imports as its arrows), so the rule below can fail
    assert TOP in MODULES and "workbench.models" in _edges(TOP)
    assert "workbench._blas" in _edges(TOP)


def test_no_module_imports_the_top_package():
    # the top package is the user's door (workbench.load, workbench.trace ...): inside the
    # package a module imports the module that defines what it uses (the CLI, the other
    # door, may read the version from it)
    bad = [f"{m}:{ln} imports {n}" for m in MODULES if m not in (TOP, CLI) for n, ln in GRAPH[m].get(TOP, [])]
    assert not bad, "upward arrows to the top package:\n" + "\n".join(bad)


#: the packages built on the library (docs/design.md, layers 6 and 7): the library imports none
FRONTS = ("workbench.demo", "workbench.zoo", "workbench.exercises", "workbench.notebook", "workbench.widgets",
          "workbench.lab", CLI)


def _in(m: str, packages) -> bool:
    return any(m == p or m.startswith(p + ".") for p in packages)


def test_no_library_module_imports_a_front():
    # e.g. causal/ measuring the demo: the study lives in demo/, which imports causal
    assert _in("workbench.demo.study", FRONTS) and not _in("workbench.causal", FRONTS)
    bad = [f"{m} imports {t} (line {GRAPH[m][t][0][1]})" for m in MODULES if m != TOP and not _in(m, FRONTS)
           for t in _edges(m) if _in(t, FRONTS)]
    assert not bad, "\n".join(bad)


def test_no_library_module_imports_the_cli():
    bad = [f"{m} imports {CLI} (line {ln})" for m in MODULES if m != CLI
           for n, ln in GRAPH[m].get(CLI, [])]
    assert not bad, "\n".join(bad)


def test_no_module_reads_another_modules_underscore_names():
    bad = []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> workbench module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if _target(a.name) and a.name.startswith("workbench"):
                        aliases[a.asname or a.name] = a.asname and a.name or a.name
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, node)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if _target(full) == full:
                        aliases[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__") and _target(base) \
                            and _target(base) != mod and base.startswith("workbench"):
                        bad.append(f"{mod}:{node.lineno} imports {base}.{a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = ast.unparse(node.value)
                if owner in aliases and aliases[owner] != mod:
                    bad.append(f"{mod}:{node.lineno} reads {aliases[owner]}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_plots_read_data_objects_only():
    # docs/design.md: plots depend on data objects (and the small shared modules), never on
    # the code that makes them
    bad = [f"{m} imports {t}" for m in MODULES if m.startswith("workbench.plots")
           for t in _edges(m) if t.startswith(("workbench.diff", "workbench.trace", "workbench.widgets",
                                               "workbench.models", "workbench.reference"))]
    assert not bad, "\n".join(bad)
