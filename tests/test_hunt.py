"""NaN hunting on zoo checkpoints with planted faults, and the `workbench hunt` CLI."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench import zoo
from workbench.cli import main
from workbench.notebook import planted

IDS = [2, 15, 16, 17, 18, 19, 20, 21]
IDS_ARG = ",".join(map(str, IDS))


def _key(ts, suffix):
    (k,) = [k for k in ts if k.endswith(suffix)]
    return k


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hunt")
    clean = zoo.build("gemma4_text", root / "clean", dtype="float32")

    def overflow(ts):  # activations of layer 1's MLP pass 65504 in float16 (finite in float32)
        for n in ("layers.1.mlp.up_proj.weight", "layers.1.mlp.gate_proj.weight"):
            ts[_key(ts, n)] = ts[_key(ts, n)] * 1000

    def nan_weight(ts):
        k = _key(ts, "layers.2.mlp.down_proj.weight")
        w = np.array(ts[k])
        w[5, 7] = np.nan
        ts[k] = mx.array(w)

    def big_weight(ts):  # finite in float32 storage, +inf once cast to float16
        k = _key(ts, "layers.0.self_attn.o_proj.weight")
        w = np.array(ts[k])
        w[1, 1] = 1e5
        ts[k] = mx.array(w)

    return {"clean": Path(clean),
            "overflow": planted(Path(clean), root / "overflow", overflow),
            "nan_weight": planted(Path(clean), root / "nan_weight", nan_weight),
            "big_weight": planted(Path(clean), root / "big_weight", big_weight)}


def test_planted_fp16_overflow_found_with_cause(ckpts):
    m = workbench.load(ckpts["overflow"])
    r = workbench.trace.hunt(m, IDS, dtype="float16")
    f = r.report["first_nonfinite"]
    assert f is not None
    assert (f["op"], f["layer"], f["cause"]) == ("layers.1.mlp.act", 1, "overflow")
    assert f["posinf"] + f["neginf"] > 0 and f["float32_absmax"] > 65504
    assert r.report["ops_checked"] == m.program.index("layers.1.mlp.act") + 1
    # every op before it is finite, and the ones feeding it show their (small) headroom
    assert all(not s.nonfinite for s in r.trace.steps[:-1])
    assert r.trace.stats("layers.1.mlp.up_proj")["headroom"] > 1e-3
    # the same checkpoint is clean in float32 (and in bfloat16's wide range)
    for dt in ("float32", "bfloat16"):
        r32 = workbench.trace.hunt(m, IDS, dtype=dt)
        assert r32.report == {"first_nonfinite": None, "ops_checked": len(m.program),
                              "logits": {"positions": "all", "of": len(IDS), "note": None},
                             "pruned": None}


def test_planted_nan_weight_found_with_cause(ckpts):
    m = workbench.load(ckpts["nan_weight"])
    r = workbench.trace.hunt(m, IDS, dtype="float32")
    f = r.report["first_nonfinite"]
    assert (f["op"], f["layer"], f["cause"]) == ("layers.2.mlp.down_proj", 2, "nonfinite-weight")
    # weight row 5 is NaN at column 7: output feature 5 is NaN at every position
    assert (f["nan"], f["posinf"], f["neginf"]) == (len(IDS), 0, 0)
    (w,) = f["weights"]
    assert w["name"] == "layers.2.mlp.down_proj.weight" and w["nan"] == 1
    assert f["first_index"] == [0, 0, 5]  # batch 0, token 0, output feature 5 (the NaN weight's row)


def test_weight_past_compute_range(ckpts):
    m = workbench.load(ckpts["big_weight"])
    f = workbench.trace.hunt(m, IDS, dtype="float16").finding
    assert f.op == "layers.0.self_attn.o_proj" and f.cause == "nonfinite-weight"
    assert "float16" in f.detail and f.weights[0]["out_of_range"]
    assert workbench.trace.hunt(m, IDS, dtype="float32").finding is None


def run_cli(*argv, capsys):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_and_exit_codes(ckpts, capsys):
    rc, out, _ = run_cli("hunt", str(ckpts["overflow"]), "--ids", IDS_ARG, "--dtype", "float16", "--json",
                         capsys=capsys)
    d = json.loads(out)
    assert rc == 1 and set(d) == {"first_nonfinite", "ops_checked", "logits", "pruned"}
    f = d["first_nonfinite"]
    assert {"op", "layer", "cause", "nan", "posinf", "neginf"} <= set(f)
    assert (f["op"], f["cause"]) == ("layers.1.mlp.act", "overflow")

    rc, out, _ = run_cli("hunt", str(ckpts["overflow"]), "--ids", IDS_ARG, "--dtype", "float32", "--json",
                         capsys=capsys)
    d = json.loads(out)
    assert rc == 0 and d["first_nonfinite"] is None and d["ops_checked"] == 179  # fused attention: 1 op a layer
    assert set(d) == {"first_nonfinite", "ops_checked", "logits", "pruned"} and d["logits"]["positions"] == "all"

    rc, out, _ = run_cli("hunt", str(ckpts["nan_weight"]), "--prompt", "the cat sat on the mat", capsys=capsys)
    assert rc == 1 and "nonfinite-weight" in out and "layers.2.mlp.down_proj" in out

    rc, out, _ = run_cli("hunt", str(ckpts["clean"]), "--prompt", "hello world", capsys=capsys)
    assert rc == 0 and out.startswith("clean:") and "closest to overflow" in out


@pytest.mark.parametrize("args,msg", [
    (["--ids", "1,x"], "not an integer"),
    (["--ids", "1,99999"], "out of range"),
    (["--ids", ""], "empty"),
])
def test_cli_unusable_input(ckpts, capsys, args, msg):
    rc, out, err = run_cli("hunt", str(ckpts["clean"]), *args, capsys=capsys)
    assert rc == 2 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_missing_checkpoint_and_no_tokenizer(tmp_path, ckpts, capsys):
    rc, _, err = run_cli("hunt", str(tmp_path / "nothing"), "--ids", "1", capsys=capsys)
    assert rc == 2 and "cannot load" in err
    notok = tmp_path / "notok"
    shutil.copytree(ckpts["clean"], notok)
    (notok / "tokenizer.json").unlink()
    rc, _, err = run_cli("hunt", str(notok), "--prompt", "hello", capsys=capsys)
    assert rc == 2 and "tokenizer" in err


def test_cli_entry_point_subprocess(ckpts):
    p = subprocess.run([sys.executable, "-m", "workbench.cli", "hunt", str(ckpts["nan_weight"]), "--ids", IDS_ARG,
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["first_nonfinite"]["cause"] == "nonfinite-weight"


def test_hunt_through_the_kv_cache_in_generation(ckpts):
    m = workbench.load(ckpts["overflow"])
    g = workbench.generate(m, IDS, max_tokens=3, dtype="float16")
    k, f = g.first_nonfinite()
    # the prompt's forward overflows first; the cause is found by replaying with a copy of the cache
    assert k == 0 and (f.op, f.cause) == ("layers.1.mlp.act", "overflow") and f.float32_absmax > 65504
    clean = workbench.generate(m, IDS, max_tokens=3, dtype="float32")
    assert clean.first_nonfinite() is None
    # a NaN injected in every forward: the per-token forward (one token, reading the cache) finds it too
    gi = workbench.generate(workbench.load(ckpts["clean"]), IDS, max_tokens=2,
                            interventions=[workbench.trace.inject("layers.3.mlp.down_proj", float("nan"))])
    f1 = gi.traces[1].first_nonfinite()
    assert (f1.op, f1.cause, f1.nan) == ("layers.3.mlp.down_proj", "injected", 1)


def test_nan_scale_of_an_mxfp4_weight(tmp_path):
    src = zoo.build("qwen3", tmp_path / "q", quant="mxfp4", dtype="float32")

    def poison(ts):  # E8M0 scale 0xFF is NaN
        k = _key(ts, "layers.1.mlp.down_proj.scales")
        s = np.array(ts[k])
        s[3, 1] = 255
        ts[k] = mx.array(s)
    m = workbench.load(planted(Path(src), tmp_path / "bad", poison))
    f = workbench.trace.hunt(m, IDS, dtype="float32").finding
    assert (f.op, f.cause) == ("layers.1.mlp.down_proj", "nonfinite-weight")
    (sc,) = [w for w in f.weights if w["name"].endswith(".scales")]
    assert sc["nan"] == 1
    assert workbench.trace.hunt(workbench.load(src), IDS, dtype="float32").finding is None


def test_cli_names_the_tensor_that_cannot_run(tmp_path, capsys):
    # the load checks every tensor's shape against the config before anything runs
    path = zoo.build("llama", tmp_path / "bad", broken="shape-mismatch", dtype="float32")
    rc, _, err = run_cli("hunt", str(path), "--ids", "2,3,4", capsys=capsys)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "layers." in err and "has shape" in err and "expected" in err
