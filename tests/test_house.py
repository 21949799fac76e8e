"""The house rules of the layout (docs/design.md): no import cycle in workbench/, between
modules or between packages (every import counted: module-level, inside functions, relative,
``importlib.import_module("workbench....")``), no module imports the top package (``import
workbench`` / ``from workbench import load``: an arrow to everything), no library module
imports the CLI, no module reads another workbench module's underscore names."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "workbench"

#: the command-line front: workbench/cli.py itself may import anything
CLI = "workbench.cli"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under ``root`` (a ``workbench`` directory) by dotted name."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = modules()


def _resolve(mods: dict, mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = mod.split(".") if mods[mod].name == "__init__.py" else mod.split(".")[:-1]
    base = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str, mods: dict = MODULES) -> str | None:
    """The workbench module an imported dotted name lands in (the longest known prefix)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in mods:
            return cand
    return None


def _imported_names(mods: dict, mod: str, node) -> list[str]:
    """The dotted names one AST node imports: ``import a.b``, ``from .x import y`` (y may be a
    submodule or a name of x), ``importlib.import_module("a.b")`` with a literal name."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _resolve(mods, mod, node)
        return [f"{base}.{a.name}" if _target(f"{base}.{a.name}", mods) == f"{base}.{a.name}" else base
                for a in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name == "import_module":
            return [node.args[0].value]
    return []


def imports(mods: dict, mod: str) -> dict[str, list[tuple[str, int]]]:
    """workbench modules ``mod`` imports (anywhere in the file) -> [(imported name, line)]."""
    tree = ast.parse(mods[mod].read_text(), filename=str(mods[mod]))
    out: dict[str, list] = {}
    for node in ast.walk(tree):
        for n in _imported_names(mods, mod, node):
            t = _target(n, mods)
            if t is not None and t != mod and n.startswith("workbench"):
                out.setdefault(t, []).append((n, node.lineno))
    return out


def _imports(mod: str) -> dict[str, list[tuple[str, int]]]:
    return imports(MODULES, mod)


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


# ------------------------------------------------------------------ packages

def package_of(m: str, mods: dict = MODULES) -> str:
    """The node a module counts in: its package right under workbench (``workbench.trace`` for
    ``workbench.trace.stats.host``), or itself for the top package and a top-level module
    (``workbench.program``)."""
    top = ".".join(m.split(".")[:2])
    return top if top != m and top in mods and mods[top].name == "__init__.py" else m


def package_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """package -> the packages it imports -> the imports making each arrow (``module:line``)."""
    mods = modules(root)
    out: dict[str, dict[str, list[str]]] = {}
    for m in mods:
        a = package_of(m, mods)
        arrows = out.setdefault(a, {})
        for t, where in imports(mods, m).items():
            b = package_of(t, mods)
            if b != a:
                arrows.setdefault(b, []).extend(f"{m}:{ln}" for _, ln in where)
    return out


def package_cycles(root: Path = ROOT) -> list[str]:
    """Every set of packages that import each other (a strongly connected component of the
    package graph), with the imports that close it; [] when the packages form floors."""
    g = package_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    knots: list[list[str]] = []

    def visit(v):  # (Tarjan)
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            knot = []
            while True:
                w = stack.pop()
                on.discard(w)
                knot.append(w)
                if w == v:
                    break
            if len(knot) > 1:
                knots.append(sorted(knot))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [" <-> ".join(k) + ": " + "; ".join(f"{a} -> {b} ({', '.join(g[a][b][:3])})"
                                            for a in k for b in k if b in g[a]) for k in knots]


def test_the_package_graph_is_read():
    assert package_of("workbench.trace.stats.host") == "workbench.trace"
    assert package_of("workbench.program") == "workbench.program" and package_of(TOP) == TOP
    g = package_graph()
    assert "workbench.checkpoint" in g["workbench.models"]
    assert "workbench.program" in g["workbench.models"]


def test_no_package_cycle():
    # the packages stand on floors (docs/design.md, "What may import what"): no import, lazy or
    # not, runs from a package back to one that imports it
    knots = package_cycles()
    assert not knots, "packages that import each other:\n" + "\n".join(knots)


def test_a_function_level_import_closes_a_package_cycle(tmp_path):
    # the rule can fail: an import inside a function, a relative one, or import_module by name
    for upward in ("def f():\n    from workbench.a import x\n",
                   "def f():\n    from ..a import x\n",
                   "import importlib\nM = importlib.import_module('workbench.a.x')\n"):
        root = tmp_path / str(len(list(tmp_path.iterdir()))) / "workbench"
        for pkg in ("a", "b"):
            (root / pkg).mkdir(parents=True)
            (root / pkg / "__init__.py").write_text("")
        (root / "__init__.py").write_text("")
        (root / "a" / "x.py").write_text("from workbench.b import y\n")
        (root / "b" / "y.py").write_text(upward)
        knots = package_cycles(root)
        assert len(knots) == 1 and knots[0].startswith("workbench.a <-> workbench.b"), (upward, knots)
        (root / "b" / "y.py").write_text("")
        assert package_cycles(root) == []


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
                base = _resolve(MODULES, mod, node)
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


def test_family_files_import_only_the_readers_primitives():
    # a family's knowledge (checkpoint/families/) stands below the reader that consults it:
    # the config-reading rules (checkpoint.fields), its neighbours and the model-type registry
    allowed = ("workbench.checkpoint.fields", "workbench.checkpoint.families", "workbench.registry",
               "workbench.errors")
    fams = [m for m in MODULES if m.startswith("workbench.checkpoint.families")]
    assert "workbench.checkpoint.families.llama" in fams
    bad = [f"{m} imports {t}" for m in fams for t in _edges(m) if not _in(t, allowed)]
    assert not bad, "\n".join(bad)


def test_plots_read_data_objects_only():
    # docs/design.md: plots depend on data objects (and the small shared modules), never on
    # the code that makes them
    bad = [f"{m} imports {t}" for m in MODULES if m.startswith("workbench.plots")
           for t in _edges(m) if t.startswith(("workbench.diff", "workbench.trace", "workbench.widgets",
                                               "workbench.models", "workbench.reference"))]
    assert not bad, "\n".join(bad)
