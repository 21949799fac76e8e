"""nbval over every notebook: each runs top to bottom in a fresh kernel of this environment,
and every cell's output (after the sanitizers in notebooks/nbval_sanitize.cfg: timings,
addresses, temporary paths) must equal the output committed in the notebook.  Cells whose
output legitimately varies carry the ``nbval-ignore-output`` tag (set in notebooks/build.py).

Each notebook runs in its own pytest subprocess, so one notebook's kernel state, imports
or failures never leak into the rest of the suite.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
sys.path.insert(0, str(NB_DIR))
from build import NOTEBOOKS  # noqa: E402  (the notebook list lives with the notebooks' source)

sys.path.remove(str(NB_DIR))


def test_every_notebook_is_built_from_build_py():
    on_disk = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    assert on_disk == sorted(NOTEBOOKS), "notebooks/ and notebooks/build.py disagree; run python notebooks/build.py"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_committed_without_errors(name):
    nb = json.loads((NB_DIR / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{name} has no code cells"
    assert all(c.get("execution_count") for c in code), f"{name} is committed unexecuted; run python notebooks/build.py {name}"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{name} is committed with errors: {[e['ename'] + ': ' + e['evalue'] for e in errors]}"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
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
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(NB_DIR / "nbval_sanitize.cfg")
    pats = [(cfg[s]["regex"], cfg[s]["replace"]) for s in cfg.sections()]

    def sanitize(t):
        for rx, rep in pats:
            t = re.sub(rx, rep, t)
        return t

    assert sanitize("step took 12.5 ms at 0x7f3a2c001234 in /tmp/tmpab12cd/x") == "step took <TIME> at <ADDR> in <TMP>"
    kept = total = 0
    for name in NOTEBOOKS:
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


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_notebook_matches_build_py(name):
    """The committed cells are exactly what notebooks/build.py generates (no hand edits)."""
    sys.path.insert(0, str(NB_DIR))
    try:
        import build
        fresh = build.make(name)
    finally:
        sys.path.remove(str(NB_DIR))
    nb = json.loads((NB_DIR / name).read_text())
    committed = [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("tags", [])) for c in nb["cells"]]
    generated = [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in fresh.cells]
    assert committed == generated, f"{name} differs from notebooks/build.py; run python notebooks/build.py {name}"
