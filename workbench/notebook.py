"""The notebooks: a helper they share with the tests, and the tool that builds them.

Each notebook's source is ``notebooks/NN_name.py`` in jupytext's percent format (``# %%``
starts a code cell, ``# %% [markdown]`` a prose cell, ``# %% tags=["nbval-ignore-output"]``
a code cell whose output varies); ``notebooks/NN_name.ipynb`` is its executed pair
(jupytext formats ``ipynb,py:percent``), committed with outputs and widget state.

    python -m workbench.notebook build            # every notebook: .py -> executed .ipynb
    python -m workbench.notebook build 03 04      # only these (by number or name)
    python -m workbench.notebook check            # exit 1 when a pair (or the manifest) is out of sync

``build`` also rewrites ``notebooks/trusted.sha256``, the name and SHA-256 of every executed
notebook: the only files ``workbench lab`` marks trusted (commit it with the notebooks).

The exercises at the end of each notebook call ``workbench.exercises.check("NN.k", answer)``:
the answers, hints and solutions live in that package, never in the notebook.

``build`` executes in a fresh kernel of this environment (cwd notebooks/, PYTHONHASHSEED=0)
with nbclient and stores the widget state, so JupyterLab shows each view before the
notebook is run.  Building needs jupytext and nbclient (the ``test`` extra).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from workbench import fsio

from workbench.lab import NOTEBOOKS

FORMATS = "ipynb,py:percent"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


# ------------------------------------------------------------------ shared with the tests

def planted(src, dst, change) -> Path:
    """A copy of checkpoint directory ``src`` at ``dst`` (which must not exist) whose
    ``model.safetensors`` has ``change(tensors)`` applied to its dict of MLX arrays (in
    place).  The original is never touched: the changed file is written next to the
    copy's and renamed over it."""
    import mlx.core as mx

    src, dst = Path(src), Path(dst)
    if not (src / "model.safetensors").is_file():
        raise FileNotFoundError(f"{src}: no model.safetensors to plant a change in")
    shutil.copytree(src, dst, symlinks=False)  # refuses an existing dst
    f = dst / "model.safetensors"
    tensors, meta = mx.load(str(f), return_metadata=True)
    change(tensors)
    fsio.write_with(f, lambda p: mx.save_safetensors(p, tensors, metadata=meta))  # exclusive temporary, renamed
    return dst


# ------------------------------------------------------------------ source <-> executed pair

def sources(root=NOTEBOOKS) -> list[Path]:
    """The notebook sources, ``NN_name.py``, in order."""
    return sorted(p for p in Path(root).glob("[0-9][0-9]_*.py"))


def cells(nb) -> list[tuple[str, str, list]]:
    """What the source decides about each cell: (type, source, tags)."""
    return [(c["cell_type"], c["source"] if isinstance(c["source"], str) else "".join(c["source"]),
             list(c.get("metadata", {}).get("tags", []))) for c in nb["cells"]]


def read_source(py):
    """The notebook (no outputs) that ``py`` describes, with stable cell ids (``NN-000``)."""
    import jupytext

    py = Path(py)
    nb = jupytext.read(py, fmt="py:percent")
    nb.metadata.setdefault("kernelspec", dict(KERNELSPEC))
    nb.metadata["jupytext"] = {"formats": FORMATS}
    for i, c in enumerate(nb.cells):
        c["id"] = f"{py.stem[:2]}-{i:03d}"
    return nb


def out_of_sync(py) -> str | None:
    """Why ``py`` and its .ipynb disagree (None when they are a pair in sync)."""
    import nbformat

    py = Path(py)
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.is_file():
        return f"{ipynb.name} is missing; run python -m workbench.notebook build {py.stem[:2]}"
    nb = nbformat.read(ipynb, as_version=4)
    if nb.metadata.get("jupytext", {}).get("formats") != FORMATS:
        return f"{ipynb.name}: metadata jupytext.formats is not {FORMATS!r}"
    want, have = cells(read_source(py)), cells(nb)
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            return f"{ipynb.name} cell {i} differs from {py.name} (a {w[0]} cell starting {w[1][:60]!r})"
    if len(want) != len(have):
        return f"{ipynb.name} has {len(have)} cells, {py.name} {len(want)}"
    return None


def build(py, execute: bool = True, timeout: int = 900):
    """Regenerate ``py``'s .ipynb (executed unless ``execute=False``) and write it; returns it.
    Raises RuntimeError naming the cell when a cell raises."""
    import nbformat

    py = Path(py)
    nb = read_source(py)
    if execute:
        from nbclient import NotebookClient

        os.environ["PYTHONHASHSEED"] = "0"   # the kernel inherits our environment
        os.environ.pop("MPLBACKEND", None)
        NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                       resources={"metadata": {"path": str(py.parent)}}).execute()
        for i, c in enumerate(nb.cells):
            errors = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                raise RuntimeError(f"{py.name}: cell {i} raised {errors[0]['ename']}: {errors[0]['evalue']}")
            c.metadata.pop("execution", None)   # timestamps: keep the committed file stable
        from workbench.widgets.saved import mark_unrun
        mark_unrun(nb)   # saved views: buttons disabled, "run the cell to use the buttons"
    with fsio.atomic_write(py.with_suffix(".ipynb"), "w") as f:   # exclusive temporary, renamed
        nbformat.write(nb, f)
    # jupytext (in JupyterLab) warns about a .ipynb newer than its .py, and refuses one that differs
    os.utime(py)
    return nb


def manifest(root=NOTEBOOKS) -> dict[str, str]:
    """name -> SHA-256 of the bytes of each executed notebook of ``root`` that has its source
    (what ``workbench lab`` may trust: lab.MANIFEST_NAME, written by ``build``)."""
    from workbench.lab import read_plain, sha256

    return {p.with_suffix(".ipynb").name: sha256(read_plain(p.with_suffix(".ipynb")))
            for p in sources(root) if p.with_suffix(".ipynb").is_file()}


def write_manifest(root=NOTEBOOKS) -> Path:
    """Write ``root``'s trust manifest (``trusted.sha256``, sha256sum format) for its notebooks."""
    from workbench.lab import MANIFEST_NAME, format_manifest

    dest = Path(root) / MANIFEST_NAME
    with fsio.atomic_write(dest, "w") as f:
        f.write(format_manifest(manifest(root)))
    return dest


def manifest_out_of_date(root=NOTEBOOKS) -> str | None:
    """Why ``root``'s trust manifest does not list exactly its notebooks' bytes (None when it does)."""
    from workbench.lab import MANIFEST_NAME, read_manifest

    have, want = read_manifest(Path(root) / MANIFEST_NAME), manifest(root)
    if have == want:
        return None
    bad = sorted(set(have) ^ set(want)) or sorted(n for n in want if have[n] != want[n])
    return (f"{MANIFEST_NAME} is out of date ({', '.join(bad[:3])}); "
            "run python -m workbench.notebook build (it rewrites the manifest)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.notebook", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "check"])
    ap.add_argument("which", nargs="*", help="notebook numbers or names (default: all)")
    ap.add_argument("--no-execute", action="store_true", help="build: write the cells only, no outputs")
    ap.add_argument("--dir", default=str(NOTEBOOKS), help=f"notebook directory (default {NOTEBOOKS})")
    args = ap.parse_args(argv)
    pys = sources(args.dir)
    if args.which:
        pys = [p for p in pys if any(p.stem == w or p.name == w or p.stem.startswith(w) for w in args.which)]
        if not pys:
            print(f"no notebook source matches {' '.join(args.which)} in {args.dir}", file=sys.stderr)
            return 2
    if args.command == "check":
        bad = [why for why in map(out_of_sync, pys) if why]
        if not args.which:
            bad += [f"{nb.name} has no source {nb.stem}.py" for nb in sorted(Path(args.dir).glob("*.ipynb"))
                    if not nb.with_suffix(".py").is_file()]
            if Path(args.dir).resolve() == NOTEBOOKS.resolve() or (Path(args.dir) / "trusted.sha256").exists():
                bad += [why for why in [manifest_out_of_date(args.dir)] if why]
        for why in bad:
            print(why)
        return 1 if bad else 0
    for py in pys:
        t0 = time.perf_counter()
        try:
            nb = build(py, execute=not args.no_execute)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"{py.with_suffix('.ipynb').name}: {len(nb.cells)} cells, {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"{write_manifest(args.dir).name}: the notebooks `workbench lab` trusts", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
