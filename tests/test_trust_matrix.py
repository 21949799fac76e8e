"""Every trust repro, re-run as a user runs it, as one standing table (issue 41, item 4).

Each case is a repro from a trust round's issue (33: round 3; 41: this round), run exactly
as a user would: the command line in a child process (tests/test_hostile.py's
``run_cli``, which measures the child's own CPU time and peak RSS), or a library call in a
child (``run_code``: a regression that crashes the process fails the case, never pytest).
Each case asserts the promised exit status (2: unusable input, 1: findings, 0: done), that
an exit-2 case says so in exactly one stderr line holding its key words (the file, tensor,
id or size named), that a case with findings prints them (its key words on stdout, nothing
on stderr), that nothing says what it must not ("same", "no divergence", "OK"), that no
traceback is printed, and bounds on the child's CPU time and peak memory.

Library cases run a call in a child that prints ``TypeName: message`` on stderr and exits 2
when the call raises, 0 when it returns.

At the end of the module (a module-scoped fixture's teardown) the table is written to
test-artifacts/trust_matrix.json: each case's name, issue, command, exit status, seconds
(wall and CPU) and peak MB.  Add this round's repros to ``THIS_ROUND`` below.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from test_hostile import run_cli, run_code
from test_trust_inputs import FORGED, _safetensors
from test_trust_memory import _sparse_checkpoint

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "assets" / "demo"
IDS = "2,17,3,42,8,99,23"
ARTIFACT = REPO / "test-artifacts" / "trust_matrix.json"
SAME = re.compile(r"\bsame\b")


@dataclass
class Case:
    name: str                     # the repro, in the issue's words
    issue: int                    # the trust round's issue
    run: Callable                 # (Workspace) -> (Run, command shown in the table)
    rc: int                       # the promised exit status
    words: tuple = ()             # rc 2: in the one stderr line; else: on stdout
    err: tuple | None = None      # rc 0 / 1: the one stderr line's words (None: stderr stays empty)
    forbid: tuple = ()            # never printed (stdout or stderr); a compiled regex or a string
    check: Callable | None = None  # (Workspace, Run) -> None: what else must hold (files untouched, ...)
    cpu: float = 30.0             # the child's CPU seconds, at most (each takes 0.1-2.5 s here)
    peak_mb: float = 800.0        # the child's peak RSS, at most (each peaks at 15-110 MB here)
    skip: Callable | None = None  # (Workspace) -> reason or None


@dataclass
class Workspace:
    """One per module: a copy of the demo that cases read (never damage), a reference dump,
    and a folder for each case's own files."""
    root: Path
    ck: Path
    ref: Path | None = None
    g4: Path | None = None
    made: dict = field(default_factory=dict)

    def copy(self, name: str) -> Path:
        """A fresh copy of the demo for a case that damages it."""
        d = self.root / name
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(self.ck, d)
        return d

    def dir(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(exist_ok=True)
        return d

    def shown(self, argv) -> str:
        """The command as the table shows it: the module's paths by name."""
        out = []
        for a in map(str, argv):
            a = a.replace(str(self.ck), "DEMO").replace(str(self.root), "$TMP").replace(str(DEMO), "assets/demo")
            out.append(a if re.fullmatch(r"[\w./$:,=+-]*", a) else repr(a))
        return " ".join(out)


def _of(ws, x):
    return x(ws) if callable(x) else x


def cli(*argv, cwd=None, env=None, safe_path=False):
    """A case that runs ``workbench ARGV`` (ARGV, ``cwd`` and ``env``'s values may be callables
    of the workspace; ``safe_path``: as the console script runs, the folder off the path)."""
    def go(ws: Workspace):
        args = [_of(ws, a) for a in argv]
        e = {k: str(_of(ws, v)) for k, v in (env or {}).items()}
        return run_cli(*args, cwd=_of(ws, cwd), env=e, safe_path=safe_path), "workbench " + ws.shown(args)
    return go


def lib(call: str, setup: str = "", cwd=None, env=None):
    """A case that makes a library call in a child: ``setup`` (Python, may use ``WS``: the
    workspace's paths) then ``call``, an expression; raising is exit 2 with its one line."""
    def go(ws: Workspace):
        names = {"DEMO": str(ws.ck), "ROOT": str(ws.root), "REF": str(ws.ref), "G4": str(ws.g4)}
        code = (f"import sys\nWS = {names!r}\n{setup}\n"
                f"try:\n    _r = {call}\nexcept Exception as e:\n"
                f"    print(f'{{type(e).__name__}}: {{e}}', file=sys.stderr)\n    sys.exit(2)\n"
                f"print('returned', repr(_r)[:200])\n")
        e = {k: str(_of(ws, v)) for k, v in (env or {}).items()}
        return run_code(code, cwd=_of(ws, cwd), env=e), f"python: {call}"
    return go


# ----------------------------------------------------------------------------- case setups
def cut(kind: str):
    def make(ws: Workspace) -> Path:
        d = ws.copy(f"cut-{kind}")
        f = d / "model.safetensors"
        size = f.stat().st_size
        with open(f, "r+b") as fh:
            fh.truncate(size - 1 if kind == "byte" else size // 2)
        return d
    return make


def engine_mostly_unmatched(ws: Workspace) -> Path:
    """issue 33: an engine's dump whose names mostly match none of ours (only lm_head and
    logits), with a RoPE bug upstream under its own names."""
    from safetensors.numpy import load_file

    out = ws.dir("engine") / "engine.npz"
    if not out.exists():
        eng = {}
        for op, x in load_file(str(ws.ref)).items():
            if op in ("lm_head", "logits"):
                eng[op] = x
            else:
                eng[f"model.{op}.output"] = x * 1.5 if op.endswith("q_rope") else x
        np.savez(out, **eng)
    return out


def with_model_type(mt: str):
    def make(ws: Workspace) -> Path:
        d = ws.copy("mt-" + re.sub(r"\W", "_", mt))
        cfg = json.loads((d / "config.json").read_text())
        cfg["model_type"] = mt
        (d / "config.json").write_text(json.dumps(cfg))
        return d
    return make


def fifo_tokenizer(ws: Workspace) -> Path:
    d = ws.copy("fifo-tokenizer")
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "tokenizer.json")
    return d


def index_escaping(ws: Workspace) -> Path:
    d = ws.dir("escape") / "ck"
    if not d.exists():
        d.mkdir()
        shutil.copy(ws.ck / "config.json", d / "config.json")
        outside = d.parent / "outside.safetensors"
        shutil.copy(ws.ck / "model.safetensors", outside)
        raw = outside.read_bytes()
        hdr = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        wm = {k: "../outside.safetensors" for k in hdr if k != "__metadata__"}
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return d


def forged_names(ws: Workspace) -> Path:
    """A checkpoint holding a tensor whose name carries a newline, terminal escapes and a
    fake "OK: no errors" line."""
    d = ws.dir("forged")
    shutil.copy(ws.ck / "config.json", d / "config.json")
    _safetensors(d / "model.safetensors", ["model.embed_tokens.weight", FORGED])
    return d


def sparse_over_memory(ws: Workspace) -> Path:
    from workbench.device_memory import available_memory

    d = ws.root / "big"
    if not d.exists():
        avail, _ = available_memory()
        _sparse_checkpoint(d, max(120_000_000, int(avail * 1.3) // 256))
    return d


def no_sparse_files(ws: Workspace):
    from workbench.device_memory import available_memory

    if available_memory()[0] is None:
        return "no memory figure on this machine"
    d = sparse_over_memory(ws)
    if os.stat(d / "model.safetensors").st_blocks * 512 > 64 << 20:
        shutil.rmtree(d)
        return "this filesystem makes no sparse files"
    return None


def existing(name: str, data: bytes = b"not yours"):
    def make(ws: Workspace) -> Path:
        f = ws.dir("plots") / name
        f.write_bytes(data)
        return f
    return make


def untouched(name: str, data: bytes = b"not yours"):
    def check(ws: Workspace, r):
        assert (ws.root / "plots" / name).read_bytes() == data, f"{name} was overwritten"
    return check


def _absent(path: Path) -> None:
    assert not path.exists(), f"{path} was written"


def many_rules(ws: Workspace) -> Path:
    f = ws.dir("rules") / "many.json"
    f.write_text(json.dumps([[f"^n{i}$", "x"] for i in range(200_000)]))
    return f


def fake_blas_cwd(ws: Workspace) -> Path:
    d = ws.dir("blas-cwd")
    lib_dir = d / "cmeel.prefix" / "lib"
    lib_dir.mkdir(parents=True, exist_ok=True)
    (lib_dir / "libopenblas.so.0").write_bytes(b"\x7fELF not really")
    return d


def lab_folder(ws: Workspace) -> Path:
    """The committed first notebook, and a stranger symlinked in under an unknown name."""
    from workbench import lab

    d = ws.dir("lab")
    root = d / "nb"
    if not root.exists():
        root.mkdir()
        shutil.copy(lab.NOTEBOOKS / "01_tour.ipynb", root / "01_tour.ipynb")
        evil = d / "elsewhere" / "evil.ipynb"
        evil.parent.mkdir()
        shutil.copy(lab.NOTEBOOKS / "02_weights.ipynb", evil)
        os.symlink(evil, root / "zz.ipynb")
    return root


def media_files(ws: Workspace) -> Path:
    d = ws.dir("media")
    if not (d / "cut.wav").exists():
        from PIL import Image

        fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
        data = np.zeros(1600, "<i2").tobytes()
        body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
        (d / "cut.wav").write_bytes((b"RIFF" + struct.pack("<I", len(body)) + body)[:-101])
        Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(d / "one.png")
    return d


# ----------------------------------------------------------------------------- the matrix
DEMO_CK = lambda ws: ws.ck  # noqa: E731
REF = lambda ws: ws.ref  # noqa: E731

#: issue 33 (trust, round 3): every repro of its list
ISSUE_33 = [
    Case("silent same: inspect --diff --values on a copy cut by one byte", 33,
         cli("inspect", cut("byte"), "--diff", DEMO_CK, "--values"), 1,
         words=("truncated-file", "a is damaged", "not vouched for"), forbid=(SAME,)),
    Case("silent same: inspect --diff (header only) against a copy cut to half", 33,
         cli("inspect", DEMO_CK, "--diff", cut("half")), 1,
         words=("truncated-file", "b is damaged"), forbid=(SAME,)),
    Case("silent no divergence: an engine dump whose names mostly match none", 33,
         cli("diff", DEMO_CK, engine_mostly_unmatched, "--ids", IDS), 1,  # (issue 42: names matched by value)
         words=("names matched by value (the engine's names matched 2 of its 143 tensors",
                "first divergence: layers.0.self_attn.q_rope", "--map"),
         forbid=("no divergence",)),
    Case("out-of-range token id on the command line", 33,
         cli("hunt", DEMO_CK, "--ids", "2,600"), 2, words=("token id 600", "vocabulary of 522")),
    Case("out-of-range answer id in a causal metric: ablate(..., logit_diff(10**9)) (was a segfault)", 33,
         lib("C.ablate(m, [2, 17, 3], [C.head(0, 0)], metric=C.logit_diff(10**9))",
             "import workbench\nfrom workbench import causal as C\nm = workbench.load(WS['DEMO'])"), 2,
         words=("ValueError", "1000000000", "vocabulary of 522")),
    Case("out-of-range token id in a trace: trace(m, [10**30]) (was std::bad_cast)", 33,
         lib("workbench.trace(m, [10**30]).run()", "import workbench\nm = workbench.load(WS['DEMO'])"), 2,
         words=("ValueError", str(10**30), "vocabulary of 522")),
    Case("a boolean array as token ids", 33,
         lib("workbench.trace(m, np.array([True, False])).run()",
             "import numpy as np, workbench\nm = workbench.load(WS['DEMO'])"), 2,
         words=("TypeError", "boolean")),
    Case("a checkpoint bigger than memory (a sparse file): hunt (was SIGSEGV)", 33,
         cli("hunt", sparse_over_memory, "--prompt", "hi"), 2,
         words=("the weights (bfloat16) need", "bytes", "memory available", "streaming cannot help"),
         peak_mb=400, skip=no_sparse_files),
    Case("a checkpoint bigger than memory (a sparse file): dump", 33,
         cli("dump", sparse_over_memory, "--prompt", "hi", "--out", lambda ws: ws.root / "big-ref.safetensors"), 2,
         words=("the weights (bfloat16) need", "memory available"), peak_mb=400, skip=no_sparse_files,
         check=lambda ws, r: _absent(ws.root / "big-ref.safetensors")),
    Case("the lab trusting a symlinked notebook", 33,
         lib("lab.trust_notebooks(WS['ROOT'] + '/lab/nb')", "from workbench import lab",
             env={"JUPYTER_DATA_DIR": lambda ws: ws.dir("jupyter-data")}), 0,
         words=("['01_tour.ipynb']",), err=("zz.ipynb", "not trusted")),
    Case("forged names: a tensor name with a newline, escapes and a fake OK line", 33,
         cli("inspect", forged_names, "--tensors"), 1,
         words=(r"x\n  OK: no errors\x1b[2K\r\x1b[1A\u202e",), forbid=("\x1b", "\r", "\u202e", "\n  OK: no errors")),
    Case("BLAS from the working directory (python -c, cwd on sys.path)", 33,
         lib("check()", "import os, workbench, workbench._blas as b\n"
             "def check():\n"
             "    here = os.path.realpath(os.getcwd())\n"
             "    bad = [c for c in b._candidates() if os.sep in c and os.path.realpath(c).startswith(here)]\n"
             "    got = workbench.blas_status().get('loaded') or ''\n"
             "    if bad or (os.sep in got and os.path.realpath(got).startswith(here)):\n"
             "        raise RuntimeError(f'BLAS taken from the working directory: {bad or got}')\n"
             "    return got",
             cwd=fake_blas_cwd), 0, words=("returned",)),
    Case("crafted model_type (a module path): inspect", 33,
         cli("inspect", with_model_type("gemma4.processing_gemma4")), 1,
         words=("error   bad-config", "model_type 'gemma4.processing_gemma4' is not a supported family"),
         forbid=("Traceback", "OK: no errors")),
    Case("crafted model_type (a module path): hunt", 33,
         cli("hunt", with_model_type("llama.os"), "--ids", "1,2"), 2,
         words=("model_type 'llama.os' is not a model name",)),
    Case("crafted model_type naming a helper module: hunt (was UnboundLocalError)", 33,
         cli("hunt", with_model_type("base"), "--ids", "1,2"), 2, words=("model_type 'base'",)),
    Case("a huge regex repeat count in --ops (grew to 10.7 GB)", 33,
         cli("dump", DEMO_CK, "--ids", "1,2", "--out", lambda ws: ws.root / "x.safetensors", "--ops",
             "re:a{1000000000}"), 2, words=("repeat count",), peak_mb=400),
    Case("200k --map rules (ran for minutes)", 33,
         cli("diff", DEMO_CK, lambda ws: ws.ck / "model.safetensors", "--ids", "1,2", "--map", many_rules), 2,
         words=("more than 1000 rules",), cpu=20),
    Case("diff --plot onto an existing file", 33,
         cli("diff", DEMO_CK, REF, "--ids", IDS, "--plot", existing("err.png")), 2,
         words=("err.png exists: not overwriting it",), check=untouched("err.png")),
    Case("diff --plot-positions onto an existing file", 33,
         cli("diff", DEMO_CK, REF, "--ids", IDS, "--plot-positions", existing("pos.png")), 2,
         words=("pos.png exists: not overwriting it",), check=untouched("pos.png")),
    Case("distributed --logits onto an existing file", 33,
         cli("distributed", DEMO_CK, "--ids", "2,15,16", "--logits", existing("logits.npy", b"precious")), 2,
         words=("logits.npy exists: not overwriting it",), check=untouched("logits.npy", b"precious")),
    Case("argument error: --max-nmse -1 (accepted)", 33,
         cli("diff", DEMO_CK, REF, "--ids", "1", "--max-nmse", "-1"), 2, words=("--max-nmse", "-1", ">= 0")),
    Case("argument error: --min-cosine 2 (accepted)", 33,
         cli("diff", DEMO_CK, REF, "--ids", "1", "--min-cosine", "2"), 2, words=("--min-cosine", "<= 1")),
    Case("argument error: --ids 1,,2 (accepted)", 33,
         cli("hunt", DEMO_CK, "--ids", "1,,2"), 2, words=("empty id",)),
    Case("argument error: non-ASCII digits in --ids (accepted)", 33,
         cli("hunt", DEMO_CK, "--ids", "\u0661,2"), 2, words=("ASCII digits",)),
    Case("argument error: an unknown flag (argparse printed 2-7 lines)", 33,
         cli("inspect", DEMO_CK, "--bogus"), 2, words=("unrecognized", "--bogus"), forbid=("usage:",)),
    Case("argument error: --memory-budget -5GB (could not be passed)", 33,
         cli("hunt", DEMO_CK, "--prompt", "hi", "--memory-budget", "-5GB"), 2,
         words=("--memory-budget must be positive, not '-5GB'",)),
    Case("a FIFO tokenizer.json (reported as missing)", 33,
         cli("hunt", fifo_tokenizer, "--prompt", "hi"), 2, words=("tokenizer.json", "FIFO")),
    Case("an index entry escaping the directory (said: names no shard files)", 33,
         cli("inspect", index_escaping), 2, words=("escapes the checkpoint directory", "outside.safetensors"),
         forbid=("names no shard files",)),
    Case("media: a truncated WAV (a wave error without the file's name)", 33,
         lib("media.load_audio(WS['ROOT'] + '/media/cut.wav', 16000)",
             "from workbench.reference import media\n"), 2,
         words=("ValueError", "media/cut.wav", "truncated")),
    Case("media: a 1x1 PNG (a PIL / mlx-vlm error without the file's name)", 33,
         lib("workbench.trace(g4, [5, 6], images=[WS['ROOT'] + '/media/one.png'])",
             "import workbench\ng4 = workbench.load(WS['G4'], granularity='module')"), 2,
         words=("ValueError", "media/one.png", "image processor cannot take it")),
    Case("load(None) (AttributeError)", 33,
         lib("workbench.load(None)", "import workbench"), 2, words=("TypeError", "not NoneType")),
    Case("load(path, library='os') (accepted)", 33,
         lib("workbench.load(WS['DEMO'], library='os')", "import workbench"), 2,
         words=("ValueError", "library must be None, 'mlx_lm' or 'mlx_vlm', not 'os'")),
    Case("an unknown keyword to trace (logit= for logits=)", 33,
         lib("workbench.trace(m, [2, 3], logit='last')", "import workbench\nm = workbench.load(WS['DEMO'])"), 2,
         words=("TypeError", "'logit'")),
]

#: issue 41 (trust, round 4): this round's repros.  Add each one here as it is fixed:
#: the crash hunt's isolation (a planted module in the checkpoint folder or the working
#: directory never imported, a killed parent leaving no child, WORKBENCH_CRASH_AT refused
#: or named), the dump readers (the eval-callback header regex, a 100-byte dump claiming
#: 10 GiB, the int64 overflow of the element count).
def planted_folder(ws: Workspace) -> Path:
    """issue 41: a checkpoint folder holding json.py, select.py, signal.py, selectors.py,
    runpy.py and a workbench/ package, each leaving a marker and exiting 0 when imported."""
    from test_child_isolation import plant_modules

    d = ws.copy("planted")
    (ws.root / "markers").mkdir(exist_ok=True)
    plant_modules(d, ws.root / "markers")
    return d


def nothing_planted_ran(ws: Workspace, r) -> None:
    assert sorted(os.listdir(ws.root / "markers")) == [], r


def eval_callback(name: str, text):
    """issue 41: a llama.cpp eval-callback text (tests/test_dump_bounds.py's repros)."""
    def make(ws: Workspace) -> Path:
        f = ws.dir("dumps") / name
        f.write_text(text if isinstance(text, str) else text())
        return f
    return make


def _long_header_line() -> str:
    from test_dump_bounds import VALID

    return VALID + "ggml_debug: n" + (" = (f32) M(" + ") = {1,2") * 20000 + "\n"


def _big(shape: str) -> str:
    from test_dump_bounds import BIG

    return BIG.replace("SHAPE", shape)


THIS_ROUND = [
    Case("inspect vouching for a model_type nothing builds (\"..\": one warning, OK, exit 0)", 41,
         cli("inspect", with_model_type("..")), 1,
         words=("error   bad-config", "model_type '..' is not a supported family", "FAILED: 1 error(s)"),
         forbid=("OK: no errors", "warning bad-config")),
    Case("hunt --crash in a checkpoint folder holding json.py & co (the child imported them)", 41,
         cli("hunt", ".", "--crash", "--ids", "1,2,3", cwd=planted_folder, safe_path=True), 0,
         words=("no crash: the forward completed",), check=nothing_planted_ran),
    Case("a planted module exiting 0 (a false 'crash before the first step: exit code 0')", 41,
         cli("hunt", ".", "--crash", "--ids", "1,2,3", "--json", cwd=planted_folder, safe_path=True), 0,
         words=('"crash": null',), forbid=("exit code 0",), check=nothing_planted_ran),
    Case("WORKBENCH_CRASH_AT left in the environment (a planted crash looking real)", 41,
         cli("hunt", DEMO, "--crash", "--ids", "1,2,3", env={"WORKBENCH_CRASH_AT": "lm_head:FPE"}), 1,
         words=("note: WORKBENCH_CRASH_AT=lm_head:FPE is set: a planted crash", "crash: SIGFPE in lm_head",
                "suggested cause: planted by WORKBENCH_CRASH_AT")),
    Case("eval-callback text: a 380 KB header line (38 s of regex backtracking)", 41,
         cli("diff", DEMO, eval_callback("long.txt", _long_header_line), "--engine", "llama.cpp", "--ids", "1,2,3"), 2,
         words=("long.txt", "line 8"), cpu=10.0),
    Case("eval-callback text auto-detected by plain diff: the same 380 KB line", 41,
         cli("diff", DEMO, eval_callback("long2.txt", _long_header_line), "--ids", "1,2,3"), 2,
         words=("long2.txt", "line 8"), cpu=10.0),
    Case("a 100-byte dump claiming {1073741824, 2, 1, 1} (8 GiB + a 2 GiB mask allocated)", 41,
         cli("diff", DEMO, eval_callback("big.txt", lambda: _big("1073741824, 2, 1, 1")), "--engine", "llama.cpp",
             "--ids", "1,2,3"), 2, words=("big.txt", "line 1", "'big'", "budget"), peak_mb=400.0),
    Case("a shape whose element count overflows int64 ({4611686018427387904, 4, 1, 1})", 41,
         cli("diff", DEMO, eval_callback("overflow.txt", lambda: _big("4611686018427387904, 4, 1, 1")),
             "--engine", "llama.cpp", "--ids", "1,2,3"), 2, words=("overflow.txt", "line 1", "'big'"),
         forbid=("array is too big",)),
]

CASES = ISSUE_33 + THIS_ROUND
_names = [c.name for c in CASES]
assert len(set(_names)) == len(_names)
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The module's workspace; on teardown, the table goes to test-artifacts/trust_matrix.json."""
    from workbench.cli import main
    from workbench.zoo.multimodal import build_gemma4

    root = tmp_path_factory.mktemp("matrix")
    ck = root / "demo"
    shutil.copytree(DEMO, ck)
    w = Workspace(root, ck)
    w.ref = root / "ref.safetensors"
    assert main(["dump", str(ck), "--ids", IDS, "--out", str(w.ref)]) == 0
    w.g4 = build_gemma4(root / "g4")
    media_files(w)
    lab_folder(w)
    yield w
    rows = [RESULTS[c.name] for c in CASES if c.name in RESULTS]
    ARTIFACT.parent.mkdir(exist_ok=True)
    tmp = ARTIFACT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"written": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": rows}, indent=1))
    os.replace(tmp, ARTIFACT)


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"{len(lines)} lines on stderr, not one: {text[-2000:]!r}"
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=_names)
def test_repro(ws, case: Case, monkeypatch):
    if case.skip is not None:
        why = case.skip(ws)
        if why:
            RESULTS[case.name] = {"name": case.name, "issue": case.issue, "skipped": why}
            pytest.skip(why)
    from workbench.device_memory import MEMORY_ENV

    monkeypatch.delenv(MEMORY_ENV, raising=False)  # (the children see this machine's memory)
    r, shown = case.run(ws)
    RESULTS[case.name] = {"name": case.name, "issue": case.issue, "command": shown, "exit_code": r.rc,
                          "promised": case.rc, "seconds": round(r.wall, 2), "cpu_seconds": round(r.cpu, 2),
                          "peak_mb": round(r.peak_mb, 1), "held": False}
    both = r.out + r.err
    assert "Traceback" not in both, r
    assert r.rc == case.rc, r
    if case.rc == 2:
        line = _one_line(r.err)
        for w in case.words:
            assert w in line, (w, line)
    else:
        for w in case.words:
            assert w in r.out, (w, r.out[-3000:])
        if case.err is None:
            assert r.err.strip() == "", r
        else:
            line = _one_line(r.err)
            for w in case.err:
                assert w in line, (w, line)
    for f in case.forbid:
        assert not (f.search(both) if isinstance(f, re.Pattern) else f in both), (f, both[-3000:])
    if case.check is not None:
        case.check(ws, r)
    assert r.cpu < case.cpu, r
    assert r.peak_mb < case.peak_mb, r
    RESULTS[case.name]["held"] = True


def test_every_repro_of_issue_33_is_in_the_matrix():
    """The round-3 list, item by item: each has at least one case."""
    topics = ["silent same", "silent no divergence", "out-of-range token id", "bigger than memory",
              "lab trusting a symlinked notebook", "forged names", "BLAS from the working directory",
              "crafted model_type", "huge regex repeat", "200k --map rules", "--plot onto an existing file",
              "--logits onto an existing file", "argument error", "FIFO tokenizer", "escaping the directory",
              "media:", "load(None)", "library='os'"]
    names = [c.name for c in ISSUE_33]
    missing = [t for t in topics if not any(t in n for n in names)]
    assert not missing, missing
