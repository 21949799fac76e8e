"""The notebooks: each ``notebooks/NN_name.py`` (jupytext percent format, the source) is
paired with ``NN_name.ipynb`` (executed, outputs and widget state committed), and nbval
re-runs every .ipynb.

nbval: each notebook runs top to bottom in a fresh kernel of this environment, and every
cell's output (after the sanitizers in notebooks/nbval_sanitize.cfg: timings, addresses,
temporary paths) must equal the output committed in the notebook.  Cells whose output
legitimately varies carry the ``nbval-ignore-output`` tag (``# %% tags=[...]`` in the .py).
Each notebook runs in its own pytest subprocess, so one notebook's kernel state, imports
or failures never leak into the rest of the suite.
"""
from __future__ import annotations

import ast
import configparser
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from workbench import notebook
from workbench.lab import NOTEBOOKS as NB_DIR

SOURCES = notebook.sources(NB_DIR)
NAMES = [p.with_suffix(".ipynb").name for p in SOURCES]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def test_every_notebook_has_its_source():
    assert len(SOURCES) >= 8
    assert sorted(p.name for p in NB_DIR.glob("*.ipynb")) == sorted(NAMES), \
        "every notebooks/*.ipynb needs its NN_name.py source, and every source its executed .ipynb"


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_pair_in_sync(py):
    """The committed cells are exactly the .py's (no hand edits on either side)."""
    assert notebook.out_of_sync(py) is None


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_source_is_plain_python(py):
    """The .py parses as Python (IPython magics stay commented, as jupytext writes them),
    so linters and editors read it; every prose cell is a ``# %% [markdown]`` cell."""
    text = py.read_text()
    ast.parse(text, filename=str(py))
    assert text.startswith("# ---\n# jupyter:\n#   jupytext:\n#     formats: ipynb,py:percent\n")
    assert "# %% [markdown]" in text and "\n# %%\n" in text


def test_out_of_sync_is_detected(tmp_path):
    src = SOURCES[0]
    py, ipynb = tmp_path / src.name, tmp_path / src.with_suffix(".ipynb").name
    shutil.copy(src, py)
    notebook.build(py, execute=False)    # the pair, cells only
    assert notebook.out_of_sync(py) is None
    assert py.stat().st_mtime >= ipynb.stat().st_mtime   # jupytext in JupyterLab refuses an older .py
    check = [sys.executable, "-m", "workbench.notebook", "check", "--dir", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0

    text = py.read_text()
    first_md = text.index("# %% [markdown]\n") + len("# %% [markdown]\n")
    py.write_text(text[:first_md] + "# An edited first line\n" + text[first_md:])
    why = notebook.out_of_sync(py)
    assert why and "cell 0 differs" in why, why
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 1 and "cell 0 differs" in r.stdout

    py.write_text(text.replace("# %%\n", '# %% tags=["nbval-ignore-output"]\n', 1))
    assert "differs" in (notebook.out_of_sync(py) or "")
    py.write_text(text + "\n# %%\nprint('one more cell')\n")
    assert "cells" in (notebook.out_of_sync(py) or "")
    py.write_text(text)
    ipynb.unlink()
    assert "missing" in (notebook.out_of_sync(py) or "")


@pytest.mark.parametrize("name", NAMES)
def test_notebook_committed_without_errors(name):
    nb = json.loads((NB_DIR / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{name} has no code cells"
    assert all(c.get("execution_count") for c in code), \
        f"{name} is committed unexecuted; run python -m workbench.notebook build {name[:2]}"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{name} is committed with errors: {[e['ename'] + ': ' + e['evalue'] for e in errors]}"


@pytest.mark.parametrize("name", NAMES)
def test_widget_views_have_saved_state(name):
    """Every widget view in the committed outputs has its model (and the models it
    refers to) in the notebook's saved widget state, so JupyterLab can draw it before the
    notebook is run (tests/test_browser_static.py checks the drawing)."""
    nb = json.loads((NB_DIR / name).read_text())
    views = [o["data"][WIDGET_VIEW]["model_id"] for c in nb["cells"] for o in c.get("outputs", [])
             if WIDGET_VIEW in o.get("data", {})]
    state = nb["metadata"].get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    missing = [m for m in views if m not in state]
    assert not missing, f"{name}: widget views without saved state {missing}; rebuild it"
    refs = {r[len("IPY_MODEL_"):] for m in state.values() for r in re.findall(r"IPY_MODEL_[0-9a-f]{32}", json.dumps(m))}
    assert refs <= set(state), f"{name}: saved widget state refers to models it lacks"


@pytest.mark.parametrize("name", NAMES)
def test_nbval(name):
    env = dict(os.environ, PYTHONHASHSEED="0", MPLBACKEND="module://matplotlib_inline.backend_inline")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(NB_DIR / "nbval_sanitize.cfg"), "--nbval-cell-timeout", "600",
           "-o", "addopts=", "--rootdir", str(NB_DIR), str(NB_DIR / name)]
    r = subprocess.run(cmd, cwd=str(NB_DIR), env=env, capture_output=True, text=True, timeout=900)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, f"nbval failed on {name}:\n{tail}"
    assert " passed" in r.stdout and " failed" not in r.stdout, tail


def test_sanitizers_only_blank_what_varies():
    """The sanitizers must not hide real content, or nbval would compare nothing."""
    cfg = configparser.ConfigParser()
    cfg.read(NB_DIR / "nbval_sanitize.cfg")
    pats = [(cfg[s]["regex"], cfg[s]["replace"]) for s in cfg.sections()]

    def sanitize(t):
        for rx, rep in pats:
            t = re.sub(rx, rep, t)
        return t

    assert sanitize("step took 12.5 ms at 0x7f3a2c001234 in /tmp/tmpab12cd/x") == "step took <TIME> at <ADDR> in <TMP>"
    kept = total = 0
    for name in NAMES:
        nb = json.loads((NB_DIR / name).read_text())
        for c in nb["cells"]:
            tags = c.get("metadata", {}).get("tags", [])
            if c["cell_type"] != "code" or "nbval-ignore-output" in tags:
                continue
            for o in c.get("outputs", []):
                if o.get("output_type") == "stream":
                    text = "".join(o["text"])
                    total += len(text)
                    kept += sum(a == b for a, b in zip(text, sanitize(text)))
    assert total > 5000 and kept / total > 0.9, (kept, total)
    nb02 = (NB_DIR / "02_weights.ipynb").read_text()
    assert "MISNAMED: model.layers.1.mlp.down_proj.weight is stored as model.layers.1.mlp.down_prj.weight" in nb02


def test_planted_changes_only_the_copy(tmp_path):
    """workbench.notebook.planted: notebook 04 and tests/test_hunt.py plant faults with it."""
    import mlx.core as mx
    import numpy as np

    from workbench import zoo

    src = zoo.build("gemma4_text", tmp_path / "src", dtype="float32")
    before = (src / "model.safetensors").read_bytes()
    key = "model.layers.0.mlp.down_proj.weight"

    def poison(ts):
        w = np.array(ts[key])
        w[0, 0] = np.nan
        ts[key] = mx.array(w)

    dst = notebook.planted(src, tmp_path / "dst", poison)
    assert (src / "model.safetensors").read_bytes() == before
    assert np.isnan(np.array(mx.load(str(dst / "model.safetensors"))[key])[0, 0])
    assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in src.iterdir())
    with pytest.raises(FileExistsError):
        notebook.planted(src, dst, poison)
