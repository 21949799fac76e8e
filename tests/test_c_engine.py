"""The C tap (tap/workbench_tap.h) and a home-made C engine that uses it (tests/engine_c).

The engine runs the embedded demo model (Gemma 4 text) in float32 from its safetensors,
names its tensors its own way (``tok_emb``, ``blk0.att_q_proj``, ``final_norm``,
``out_proj``) and writes a dump and a ``workbench.schedule/1`` through the tap.  Clean, its
dump diffs clean against our forward and its schedule has no hazard; each planted seed bug
is named by the workbench at the right op, tensor or event:

| --bug | symptom | found by | names |
|---|---|---|---|
| alias | wrong numbers from layer 1 on | hazards; diff | dispatch blk1.att_o_proj (alias-in-dispatch); op layers.1.self_attn.o_proj |
| reuse-cb | (a crash on Metal) | hazards | dispatch blk2.pre_att_norm (cb-reuse) |
| f16-overflow | NaN | diff | op layers.2.mlp.act, scattered (overflow) |
| mxfp4-affine | wrong numbers from the start | diff; inspect | op embed_tokens; the checkpoint is mxfp4 |
| loader-name | "missing, re-download" | inspect; misnamed.rename_matches | each wanted name -> the checkpoint's |

Built with the system C compiler (cc or gcc; a missing compiler fails, never skips).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from workbench.checkpoint.misnamed import rename_matches
from workbench.cli import main
from workbench.diff.naming import apply_rules, load_rules
from workbench.diff.readers import read_safetensors

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "assets" / "demo"
TAP = ROOT / "tap"
HERE = ROOT / "tests" / "engine_c"
IDS = "2,10,20,30,40,50,60"
#: how the engine's names reach ours: matched by value (workbench/diff/automap.py), no
#: hand-written rule (tests/engine_c/map.json, the rules a porter would write by hand, is
#: checked against the proposal below)
MAP = ["--map", "auto"]
#: the engine computes in float32: our reference too
DIFF = ["--dtype", "float32", "--json"]
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]


def compiler() -> str:
    for name in ("cc", "gcc"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no C compiler (cc or gcc) on PATH: the tap and the C engine are built with it")


def build(src: Path, out: Path, *flags: str) -> Path:
    r = subprocess.run([compiler(), *STRICT, *flags, f"-I{TAP}", "-o", str(out), str(src), "-lm"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return build(HERE / "engine.c", tmp_path_factory.mktemp("engine") / "engine", "-O2")


def run_engine(engine, tmp_path, model=DEMO, bug=None, *extra):
    dump, sched = tmp_path / "engine.safetensors", tmp_path / "engine.schedule.json"
    cmd = [str(engine), str(model), "--ids", IDS, "--dump", str(dump), "--schedule", str(sched), *extra]
    r = subprocess.run(cmd + (["--bug", bug] if bug else []), capture_output=True, text=True, timeout=120)
    return r, dump, sched


def cli(capsys, *args):
    capsys.readouterr()
    rc = main(list(args))
    return rc, json.loads(capsys.readouterr().out)


def diff(capsys, model, dump):
    return cli(capsys, "diff", str(model), str(dump), *MAP, *DIFF)


def hazards(capsys, sched):
    rc, out = cli(capsys, "hazards", str(sched), "--json")
    events = json.loads(sched.read_text())["events"]
    return rc, [(h["kind"], events[h["event"]].get("name")) for h in out["hazards"]]


@pytest.fixture(scope="module")
def demo_mxfp4(tmp_path_factory):
    """The demo quantized to mxfp4 (4-bit E2M1 codes, one power-of-two scale per 32), as
    mlx-lm quantizes: every 2-D weight whose rows split into groups (assets/ holds an affine
    4-bit variant only)."""
    out = tmp_path_factory.mktemp("demo-mxfp4")
    weights = {}
    for k, v in mx.load(str(DEMO / "model.safetensors")).items():
        if k.endswith(".weight") and v.ndim == 2 and v.shape[-1] % 32 == 0:
            weights[k], weights[k[:-len("weight")] + "scales"] = mx.quantize(v, group_size=32, bits=4, mode="mxfp4")
        else:
            weights[k] = v
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = json.loads((DEMO / "config.json").read_text())
    cfg["quantization"] = cfg["quantization_config"] = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    (out / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / f, out / f)
    return out


# --------------------------------------------------------------------------- the tap

def test_tap_compiles_as_c99_and_cxx(tmp_path):
    unit = tmp_path / "unit.c"
    unit.write_text('#define WORKBENCH_TAP_IMPLEMENTATION\n#include "workbench_tap.h"\nint main(void) { return 0; }\n')
    build(unit, tmp_path / "unit")
    build(TAP / "workbench_tap.c", tmp_path / "tap.o", "-c")  # the unit a Swift / Xcode target adds
    gxx = shutil.which("g++")  # (C++ where present: the header's extern "C" and casts)
    if gxx:
        cxx = tmp_path / "unit.cpp"
        cxx.write_text(unit.read_text())
        r = subprocess.run([gxx, "-Wall", "-Wextra", "-Werror", f"-I{TAP}", "-o", str(tmp_path / "unitxx"), str(cxx)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert 'header "workbench_tap.h"' in (TAP / "module.modulemap").read_text()


def test_tap_writes_what_workbench_reads_and_refuses_hostile_input(tmp_path, capsys):
    prog = build(HERE / "tap_check.c", tmp_path / "tap_check", "-DWBT_MAX_TENSORS=4")
    (tmp_path / "target.txt").write_text("keep")
    os.symlink("target.txt", tmp_path / "link.safetensors")
    os.symlink("target.txt", tmp_path / "link.schedule.json")
    r = subprocess.run([str(prog), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    codes = dict(line.split("=") for line in r.stdout.split())
    # WBT_ENAME -2, WBT_ETOOMANY -3, WBT_ETOOBIG -4, WBT_EDEST -7, WBT_EDUP -8, WBT_EUNKNOWN -9, WBT_EINVAL -1
    assert codes == {"too_big": "-4", "bad_dtype": "-1", "long_name": "-2", "cap_name": "0", "too_many": "-3",
                     "control_char": "-2", "duplicate_key": "-8", "bad_precision": "-1", "dump_close": "0",
                     "duplicate_tensor": "-8", "symlink_open": "-7", "symlink_sched": "-7", "unknown_buffer": "-9",
                     "sched_close": "0"}
    # the symlinks were not followed, and no temporary is left behind
    assert (tmp_path / "target.txt").read_text() == "keep"
    assert (tmp_path / "link.safetensors").is_symlink() and (tmp_path / "link.schedule.json").is_symlink()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    # F16 / BF16 written by the tap are the casts MLX and numpy make (ties, subnormals, overflow, NaN)
    arrays, meta = read_safetensors(tmp_path / "dtypes.safetensors")
    x = arrays["x.f32"]
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16).astype(np.float32)
    bf16 = np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32))
    for name, want in (("x.f16", f16), ("x.bf16", bf16)):
        got, nan = arrays[name], np.isnan(want)  # bit for bit (signed zeros, infinities), NaN where NaN
        assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), name
    order = json.loads(meta.pop("workbench.op_order"))  # (written at close: the order they were added in)
    assert sorted(order) == sorted(arrays) and order[:3] == ["x.f32", "x.f16", "x.bf16"]
    assert meta == {"workbench.engine_dtype": "float16", "workbench.logit_positions": '"all"', "workbench.decode": "1"}
    rc, found = hazards(capsys, tmp_path / "alias.schedule.json")
    assert rc == 1 and found == [("alias-in-dispatch", "o_proj"), ("cb-reuse", "late")]


# --------------------------------------------------------------------------- the engine, clean

def test_clean_engine_diffs_clean_and_has_no_hazard(engine, tmp_path, capsys):
    r, dump, sched = run_engine(engine, tmp_path)
    assert r.returncode == 0, r.stderr
    rc, rep = diff(capsys, DEMO, dump)
    assert rc == 0 and rep["outcome"] == "no-divergence", rep.get("verdict")
    cov = rep["coverage"]
    assert cov["compared"] == cov["engine_tensors"] == 121 and not rep["unmatched_engine"]
    assert hazards(capsys, sched) == (0, [])
    # the proposal, counted against the rules a porter writes by hand (tests/engine_c/map.json):
    # every one of the engine's names goes to the same op, none ambiguous, none wrong
    assert rep["automap"]["counts"]["value"] + rep["automap"]["counts"]["rule"] == 121
    assert proposal_against_hand_rules(capsys, dump, tmp_path) == (121, [], [])


def proposal_against_hand_rules(capsys, dump, tmp_path, model=DEMO):
    """(names, wrong, ambiguous): the map proposed for ``dump`` (--write-map), each engine name's
    op against the rules a porter writes by hand (tests/engine_c/map.json)."""
    proposed = tmp_path / "proposed.json"
    assert cli(capsys, "diff", str(model), str(dump), "--write-map", str(proposed), *DIFF)[0] in (0, 1)
    names = list(read_safetensors(dump)[0])
    by_hand, auto = load_rules(HERE / "map.json"), load_rules(proposed)
    ambiguous = json.loads(proposed.read_text())["ambiguous"]
    listed = {n for a in ambiguous for n in a["engine"]}  # (left unmapped, said so: not wrong)
    wrong = [(n, apply_rules(n, auto), apply_rules(n, by_hand)) for n in names
             if apply_rules(n, auto) != apply_rules(n, by_hand) and n not in listed]
    return len(names), wrong, ambiguous


def quantized(model) -> set:
    return {n[len("model."):-len(".scales")] + ".weight" for n in mx.load(str(model / "model.safetensors"))
            if n.endswith(".scales")}


def test_clean_engine_on_mxfp4_weights_diffs_clean(engine, demo_mxfp4, tmp_path, capsys):
    r, dump, _ = run_engine(engine, tmp_path, demo_mxfp4, None, "--dump-weights")  # its weights as it dequantized them
    assert r.returncode == 0, r.stderr
    rc, rep = diff(capsys, demo_mxfp4, dump)
    assert rc == 0 and rep["outcome"] == "no-divergence", rep.get("verdict")
    assert rep["coverage"]["compared"] == rep["coverage"]["engine_tensors"] == 121 + 73
    assert {w["status"] for w in rep["weights"]} == {"ok"} and len(quantized(demo_mxfp4)) == 39


# --------------------------------------------------------------------------- planted bugs

def test_alias_named_by_hazards_and_by_diff(engine, tmp_path, capsys):
    r, dump, sched = run_engine(engine, tmp_path, bug="alias")
    assert r.returncode == 0, r.stderr
    assert hazards(capsys, sched) == (1, [("alias-in-dispatch", "blk1.att_o_proj")])
    rc, rep = diff(capsys, DEMO, dump)
    fd = rep["first_divergence"]
    assert rc == 1 and fd["op"] == "layers.1.self_attn.o_proj" and fd["engine_name"] == "blk1.att_o_proj"
    assert rep["first_local_divergence"] == "layers.1.self_attn.o_proj"
    assert [i["status"] for i in fd["inputs"]] == ["ok"]  # the attention output itself was right
    # behind the bug the names still go where they belong (the layers past it by the rule the
    # layers before it taught; the head's two, by shape, in the order the tap recorded)
    assert proposal_against_hand_rules(capsys, dump, tmp_path) == (121, [], [])


def test_reused_command_buffer_named_by_hazards(engine, tmp_path, capsys):
    r, dump, sched = run_engine(engine, tmp_path, bug="reuse-cb")
    assert r.returncode == 0, r.stderr
    rc, found = hazards(capsys, sched)
    assert rc == 1 and found[0] == ("cb-reuse", "blk2.pre_att_norm") and {k for k, _ in found} == {"cb-reuse"}
    assert diff(capsys, DEMO, dump)[0] == 0  # the numbers are right: only the schedule shows it


def test_f16_overflow_named_by_diff(engine, tmp_path, capsys):
    r, dump, sched = run_engine(engine, tmp_path, bug="f16-overflow")
    assert r.returncode == 0, r.stderr
    rc, rep = diff(capsys, DEMO, dump)
    fd = rep["first_divergence"]
    assert rc == 1 and fd["op"] == "layers.2.mlp.act" and fd["engine_name"] == "blk2.ffn_act"
    nf = fd["nonfinite"]
    assert nf["pattern"] == "scattered" and nf["engine"] > 0 and nf["reference"] == 0
    # nothing mapped wrong; the head's three, NaN everywhere, are like no op: listed, not guessed
    n, wrong, ambiguous = proposal_against_hand_rules(capsys, dump, tmp_path)
    assert n == 121 and not wrong and sorted(a["engine"][0] for a in ambiguous) == ["final_norm", "out_logits", "out_proj"]
    assert hazards(capsys, sched) == (0, [])


def test_mxfp4_dequantized_as_affine_named_by_diff(engine, demo_mxfp4, tmp_path, capsys):
    r, dump, _ = run_engine(engine, tmp_path, demo_mxfp4, "mxfp4-affine", "--dump-weights")
    assert r.returncode == 0, r.stderr
    # names matched by value: wrong from the first op on, nothing is any op of ours, so no op is
    # mapped by shape alone nor named as the divergence; the weights (mapped by name) say why
    rc, rep = diff(capsys, demo_mxfp4, dump)
    assert rc == 1 and rep["first_divergence"] is None and rep["automap"]["counts"]["shape"] == 0
    assert rep["first_weight_mismatch"] == "embed_tokens.weight"
    assert {w["name"] for w in rep["weights"] if w["status"] != "ok"} == quantized(demo_mxfp4)
    # the porter's next step: the map proposed on a run the engine gets right (the float
    # checkpoint: the same names), kept, and passed back: the first op reading a 4-bit weight
    clean = tmp_path / "clean"
    clean.mkdir()
    _, clean_dump, _ = run_engine(engine, clean, DEMO, None, "--dump-weights")
    rules = tmp_path / "engine-map.json"
    assert cli(capsys, "diff", str(DEMO), str(clean_dump), "--write-map", str(rules), *DIFF)[0] == 0
    rc, rep = cli(capsys, "diff", str(demo_mxfp4), str(dump), "--map", str(rules), *DIFF)
    assert rc == 1 and rep["first_divergence"]["op"] == "embed_tokens" and rep["first_local_divergence"] == "embed_tokens"
    assert rep["first_weight_mismatch"] == "embed_tokens.weight"
    rc, info = cli(capsys, "inspect", str(demo_mxfp4), "--json")
    assert rc == 0 and info["quantization"]["mode"] == "mxfp4"  # not affine: the engine's rule is wrong


def test_loader_name_bug_is_misnamed_not_missing(engine, tmp_path, capsys):
    r, _, _ = run_engine(engine, tmp_path, bug="loader-name")
    assert r.returncode == 3 and "re-download" in r.stderr
    wanted = re.findall(r"missing tensor (\S+)", r.stderr)
    assert len(wanted) == 6
    rc, info = cli(capsys, "inspect", str(DEMO), "--json", "--tensors")
    assert rc == 0 and not [p for p in info["problems"] if p.get("kind") == "missing-tensor"]  # nothing is missing
    present = [t["name"] for t in info["tensors"]]
    renamed, rules = rename_matches(wanted, [n for n in present if n not in wanted])
    assert renamed == {w: w.replace(".attn.", ".self_attn.") for w in wanted}
    assert all(renamed[w] in present for w in wanted)
    assert rules.most_common(1)[0] == (("self_attn", "attn"), 6)
