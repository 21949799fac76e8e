"""Engine diff end to end on a zoo checkpoint: dump, rename, perturb, diff (API and CLI)."""
import json
import re

import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.cli import main
from workbench.diff import Reference, compare, dump, read_dump
from workbench.diff.report import DiffError

IDS = [5, 17, 3, 42, 8, 99, 23]  # 7 tokens: no size coincides with a head count or head dim

# an engine with llama.cpp-like names, the rules that map them back to ours
RULES = [[r"^blk\.(\d+)\.l_out$", "layers.$1"], [r"^blk\.(\d+)\.attn\.", "layers.$1.self_attn."],
         [r"^blk\.(\d+)\.ffn\.", "layers.$1.mlp."], [r"^blk\.(\d+)\.", "layers.$1."],
         [r"^tok_embd$", "embed_tokens"], [r"^result_norm$", "norm"], [r"^result_output$", "logits"]]


def engine_name(op: str) -> str:
    top = {"embed_tokens": "tok_embd", "norm": "result_norm", "logits": "result_output"}
    if op in top:
        return top[op]
    m = re.fullmatch(r"layers\.(\d+)(?:\.(.*))?", op)
    if not m:
        return op
    i, rest = m.groups()
    if rest is None:
        return f"blk.{i}.l_out"
    rest = re.sub(r"^self_attn\.", "attn.", rest)
    rest = re.sub(r"^mlp\.", "ffn.", rest)
    return f"blk.{i}.{rest}"


def engine_layout(x: np.ndarray) -> np.ndarray:
    """Drop the batch; [1, H, T, D] head tensors as tokens-first, heads merged [T, H*D]; float16."""
    x = x[0]
    if x.ndim == 3 and x.shape[1] == len(IDS) and x.shape[2] != len(IDS):
        x = x.transpose(1, 0, 2).reshape(x.shape[1], -1)
    with np.errstate(over="ignore"):  # mask fill (float32's lowest) becomes -inf, as in an fp16 engine
        return np.ascontiguousarray(x).astype(np.float16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return zoo.build("gemma3_text", tmp_path_factory.mktemp("g3") / "g3", dtype="float32")


@pytest.fixture(scope="module")
def reference(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("dump") / "ref.safetensors"
    assert main(["dump", str(ckpt), "--ids", ",".join(map(str, IDS)), "--out", str(out)]) == 0
    return out


def write_engine(ref_path, dest, perturb=None, drop=(), extra=None):
    values, meta = read_dump(ref_path)
    order = json.loads(meta["workbench.op_order"])
    eng = {}
    for op in order:
        if op in drop or any(op.startswith(d + ".") for d in drop):
            continue
        x = engine_layout(values[op])
        if op == perturb:
            x = (x.astype(np.float32) * 1.25 + 0.05).astype(np.float16)
        eng[engine_name(op)] = x
    eng.update(extra or {})
    np.savez(dest, **eng)
    return eng


def test_dump_file_holds_float32_ops_in_order(ckpt, reference):
    values, meta = read_dump(reference)
    model = workbench.load(ckpt)
    order = json.loads(meta["workbench.op_order"])
    assert order == model.program_for("explicit").names and order[-1] == "logits"  # the reference: explicit attention
    assert set(values) == set(order)
    assert json.loads(meta["workbench.ids"]) == IDS
    # the dump is the reference: the logits match the model's own forward
    import mlx.core as mx
    logits = np.array(model(mx.array([IDS])).astype(mx.float32))
    np.testing.assert_allclose(values["logits"], logits, rtol=1e-5, atol=1e-5)
    from safetensors import safe_open
    with safe_open(str(reference), "numpy") as f:
        assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())


def test_dump_ops_pattern(ckpt, tmp_path):
    ref = dump(ckpt, out=tmp_path / "mlp.safetensors", ids=IDS, ops="layers.*.mlp.down_proj")
    assert list(ref.values) == [f"layers.{i}.mlp.down_proj" for i in range(workbench.load(ckpt).num_layers)]
    assert Reference.load(tmp_path / "mlp.safetensors").order == ref.order


def test_untouched_engine_dump_has_no_divergence(ckpt, reference, tmp_path, capsys):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    write_engine(reference, tmp_path / "engine.npz")
    rc = main(["diff", str(ckpt), str(tmp_path / "engine.npz"), "--ids", ",".join(map(str, IDS)),
               "--map", str(rules), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["first_divergence"] is None
    n = len(workbench.load(ckpt).program)
    assert out["compared"] >= 0.95 * n, (out["compared"], n)
    assert out["unmatched_engine"] == [] and out["unmatched_reference"] == []
    assert {o["status"] for o in out["ops"]} == {"ok"}
    assert any("transposed" in o["layout"] for o in out["ops"])  # heads were reconciled
    assert any(o["masked"] > 0 for o in out["ops"] if o["op"].endswith("scores"))
    rc = main(["diff", str(ckpt), str(tmp_path / "engine.npz"), "--ids", ",".join(map(str, IDS)), "--map", str(rules)])
    text = capsys.readouterr().out
    assert rc == 0 and text.startswith(f"no divergence: {out['compared']} ops compared")


def test_perturbed_op_is_the_first_divergence(ckpt, reference, tmp_path, capsys):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    target = "layers.2.self_attn.o_proj"
    write_engine(reference, tmp_path / "engine.npz", perturb=target, drop=("layers.5",),
                 extra={"blk.0.attn.q_scaled": np.ones((7, 4), np.float16)})
    rc = main(["diff", str(ckpt), str(tmp_path / "engine.npz"), "--ids", ",".join(map(str, IDS)),
               "--map", str(rules), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    fd = out["first_divergence"]
    assert fd["op"] == target and fd["engine_name"] == "blk.2.attn.o_proj"
    assert fd["cosine"] is not None and fd["nmse"] > 1e-2 and fd["max_abs"] > 0
    assert fd["inputs"] == [{"op": "layers.2.self_attn.context", "status": "ok"}]
    assert fd["local"]["diverged"] and out["first_local_divergence"] == target
    assert "look at this op" in out["verdict"]
    assert out["unmatched_engine"] == ["blk.0.attn.q_scaled"]
    assert "layers.5" in out["unmatched_reference"] and "layers.5.mlp.down_proj" in out["unmatched_reference"]
    assert "layers.4" not in out["unmatched_reference"]
    # text output names it too
    rc = main(["diff", str(ckpt), str(tmp_path / "engine.npz"), "--ids", ",".join(map(str, IDS)), "--map", str(rules),
               "--plot", str(tmp_path / "curve.png"), "--plot-positions", str(tmp_path / "map.png")])
    text = capsys.readouterr().out
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "map.png").read_bytes()[:4] == b"\x89PNG"
    assert rc == 1 and f"first divergence: {target}" in text and "blk.0.attn.q_scaled" in text
    # against the saved reference dump instead of the checkpoint: no input needed, same finding
    rc = main(["diff", str(reference), str(tmp_path / "engine.npz"), "--map", str(rules), "--json"])
    again = json.loads(capsys.readouterr().out)
    assert rc == 1 and again["first_divergence"]["op"] == target and again["compared"] == out["compared"]


def test_python_api_and_reference_dump_as_reference(ckpt, reference, tmp_path):
    eng = write_engine(reference, tmp_path / "e.npz", perturb="layers.0.mlp.act")
    r1 = compare(ckpt, eng, ids=IDS, rules=RULES)
    r2 = compare(reference, tmp_path / "e.npz", rules=RULES)  # a dump as the reference: no model run
    for r in (r1, r2):
        assert r.first_divergence.op == "layers.0.mlp.act"
        assert [o.op for o in r.ops] == [o for o in workbench.load(ckpt, attention="explicit").program.names
                                         if o in {x.op for x in r.ops}]
    assert r1.to_dict()["ops"] == r2.to_dict()["ops"]


def test_wrong_token_count_is_explained(ckpt, reference, tmp_path):
    values, _ = read_dump(reference)
    eng = {k: np.concatenate([v, v[:, :1]], axis=1) if v.ndim == 3 and v.shape[1] == len(IDS) else v
           for k, v in values.items() if k.startswith("layers.") and k.count(".") <= 1}
    # one line naming both counts and what to give (issue 39: a decode step is read, another count refused)
    with pytest.raises(DiffError, match=r"'layers.0' \[1, 8, 64\] holds 8 positions' values, our layers.0 "
                                        r"\[1, 7, 64\] 7: give the prompt the engine ran .* or --decode"):
        compare(ckpt, eng, ids=IDS)
    # where no residual-stream op is dumped, a shape finding still says why
    other = {k: np.concatenate([v, v[:, :1]], axis=1) for k, v in values.items()
             if k.endswith(("input_layernorm", "mlp.down_proj")) and v.ndim == 3 and v.shape[1] == len(IDS)}
    assert len(other) >= 4
    r = compare(ckpt, other, ids=IDS)
    assert r.first_divergence.status == "shape" and "same tokens (7 of them here)" in r.verdict()
    with pytest.raises(Exception, match="made for ids"):
        compare(reference, eng, ids=[1, 2])


def test_npy_directory_and_safetensors_engine(ckpt, reference, tmp_path, capsys):
    values, _ = read_dump(reference)
    d = tmp_path / "npy"
    d.mkdir()
    for op in ("embed_tokens", "layers.0", "layers.1", "logits"):
        np.save(d / f"{op}.npy", values[op][0])
    rc = main(["diff", str(ckpt), str(d), "--ids", ",".join(map(str, IDS)), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["compared"] == 4
    from safetensors.numpy import save_file
    save_file({"layers.1": values["layers.1"] * -1}, str(tmp_path / "e.safetensors"))
    rc = main(["diff", str(ckpt), str(tmp_path / "e.safetensors"), "--ids", ",".join(map(str, IDS)), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["first_divergence"]["op"] == "layers.1"
    assert out["first_divergence"]["cosine"] == pytest.approx(-1.0)


@pytest.mark.parametrize("args, msg", [
    (["diff", "{ck}", "{tmp}/missing.npz", "--ids", "1,2"], "no such file"),
    (["diff", "{ck}", "{tmp}/garbage.safetensors", "--ids", "1,2"], "garbage.safetensors"),
    (["diff", "{ck}", "{tmp}/names.npz", "--ids", "1,2"], "none of its 1 tensors maps to an op"),
    (["diff", "{ck}", "{tmp}/names.npz", "--ids", "1,2", "--map", "{tmp}/bad_rules.json"], "bad_rules.json"),
    (["diff", "{ck}", "{tmp}/names.npz"], "--prompt TEXT or --ids"),
    (["diff", "{tmp}/missing_model", "{tmp}/names.npz", "--ids", "1"], "missing_model"),
    (["dump", "{ck}", "--ids", "1,2,100000", "--out", "{tmp}/x.safetensors"], "out of range"),
    (["dump", "{ck}", "--ids", "1,2", "--out", "{tmp}/x.safetensors", "--ops", "nothing.*"], "no op matches"),
    (["dump", "{ck}", "--ids", "1,a", "--out", "{tmp}/x.safetensors"], "expected comma-separated ASCII digits"),
    (["dump", "{ck}", "--ids", "1,2", "--out", "{ck}/model.safetensors"], "not overwriting"),
    (["dump", "{tmp}/broken", "--ids", "1,2", "--out", "{tmp}/x.safetensors"], "missing-tensor"),
    (["diff", "{tmp}/badtype", "{tmp}/names.npz", "--ids", "1,2"], "model_type 'foo' is built neither by mlx-lm nor by mlx-vlm"),
    (["diff", "{ck}", "{tmp}/names.npz", "--ids", "1,2", "--min-cosine", "nan"], "argument --min-cosine: nan is out of range"),
    (["diff", "{ck}", "{tmp}/names.npz", "--ids", "1,2", "--max-nmse", "inf"], "argument --max-nmse: inf is out of range"),
    (["diff", "{ck}", "{tmp}/names.npz", "--ids", "1,2", "--max-abs=-inf"], "argument --max-abs: -inf is out of range"),
    (["diff", "{ck}", "{tmp}/names.npz", "--ids", "1,2", "--noise-factor", "NaN"], "argument --noise-factor: NaN is out of range"),
])
def test_unusable_input_exits_2_with_one_line(ckpt, tmp_path, capsys, args, msg):
    (tmp_path / "garbage.safetensors").write_bytes(b"\xff" * 64)
    np.savez(tmp_path / "names.npz", **{"tensor.nobody.knows": np.zeros(3, np.float32)})
    (tmp_path / "bad_rules.json").write_text('[["(unclosed", "x"]]')
    if "broken" in " ".join(args):
        zoo.build("llama", tmp_path / "broken", broken="missing-tensor")
    if "badtype" in " ".join(args):
        (tmp_path / "badtype").mkdir()
        (tmp_path / "badtype" / "config.json").write_text('{"model_type": "foo", "num_hidden_layers": 2}')
        (tmp_path / "badtype" / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    argv = [a.format(ck=ckpt, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err and "Traceback" not in err
    assert not (tmp_path / "x.safetensors").exists()
    assert workbench.load(ckpt).program  # the checkpoint is untouched


def test_noise_floor_calibrates_limits_per_op(tmp_path, capsys):
    """An engine computing in low precision: limits scale with our own low-precision run's error."""
    from workbench.diff import run_reference
    ck = zoo.build("llama", tmp_path / "ll", dtype="float32")
    model = workbench.load(ck)
    eng = run_reference(model, ids=IDS, dtype="float16").values  # an honest float16 engine
    clean = compare(model, eng, ids=IDS, noise_floor="bfloat16")
    assert clean.first_divergence is None and clean.noise_dtype == "bfloat16"
    for o in clean.ops:
        assert o.noise_nmse is not None
        assert o.limit_nmse == pytest.approx(max(10 * o.noise_nmse, 1e-6))
    # a 5% scale error in one op: far below the fixed limit (nmse 1e-2), far above bf16 rounding there
    target = "layers.0.mlp.gate_proj"
    bad = dict(eng, **{target: eng[target] * 1.05})
    assert compare(model, bad, ids=IDS, dtype="float32").first_divergence is None
    r = compare(model, bad, ids=IDS, noise_floor="bfloat16")
    assert r.first_divergence.op == target and "bfloat16 run" in r.first_divergence.reasons[0]
    np.savez(tmp_path / "bad.npz", **bad)
    rc = main(["diff", str(ck), str(tmp_path / "bad.npz"), "--ids", ",".join(map(str, IDS)),
               "--noise-floor", "bfloat16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["first_divergence"]["op"] == target and out["noise_dtype"] == "bfloat16"
    rc = main(["diff", str(ck), str(tmp_path / "bad.npz"), "--ids", ",".join(map(str, IDS)),
               "--noise-floor", "bfloat16", "--dtype", "bfloat16"])
    assert rc == 2 and "nothing to calibrate" in capsys.readouterr().err


def _engine_run(model, dtype, interventions=()):
    """A whole engine forward: our program in a low precision, optionally with a bug, every op dumped."""
    import mlx.core as mx
    tr = workbench.trace(model, IDS, capture="full", dtype=dtype, interventions=list(interventions))
    tr.run()
    return {n: np.array(tr.value(n).astype(mx.float32)) for n in model.program.names}


def test_local_error_finds_a_bug_hidden_under_precision(ckpt, tmp_path, capsys):
    """A bfloat16 engine with a 5% scale bug in one op: globally within tolerance, locally wrong."""
    from workbench.trace.interventions import patch
    model = workbench.load(ckpt)
    honest = compare(model, _engine_run(model, "bfloat16"), ids=IDS, dtype="float32")
    assert honest.first_local_divergence is None
    assert all(o.local_nmse is not None and o.local_nmse < 1e-4 for o in honest.ops)  # one op's rounding
    target = "layers.1.mlp.gate_proj"
    eng = _engine_run(model, "bfloat16", [patch(target, lambda v, op: v * 1.05)])
    r = compare(model, eng, ids=IDS, dtype="float32")
    assert r.first_divergence is None  # the drift it causes stays within the fixed limits...
    fl = r.first_local_divergence  # ...but fed the engine's own inputs, the op does not reproduce its output
    assert fl.op == target and fl.local_nmse > 1e-3
    assert all(not o.local_diverged for o in r.ops if o.op != target)  # everything downstream is consistent
    assert target in r.verdict() and "look at this op" in r.verdict()
    np.savez(tmp_path / "eng.npz", **eng)
    rc = main(["diff", str(ckpt), str(tmp_path / "eng.npz"), "--ids", ",".join(map(str, IDS)), "--dtype", "float32",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["first_divergence"] is None and out["first_local_divergence"] == target
    rc = main(["diff", str(ckpt), str(tmp_path / "eng.npz"), "--ids", ",".join(map(str, IDS)), "--dtype", "float32",
               "--no-local", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["first_local_divergence"] is None
    assert all(o["local_nmse"] is None for o in out["ops"])


def test_entry_point_and_lazy_attributes(tmp_path):
    import subprocess
    import sys
    code = "import workbench; workbench.diff.dump; workbench.diff.compare; workbench.plots.error_curve"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    np.savez(tmp_path / "e.npz", x=np.zeros(2, np.float32))
    p = subprocess.run([sys.executable, "-m", "workbench.cli", "diff", str(tmp_path / "nomodel"),
                        str(tmp_path / "e.npz"), "--ids", "1,2", "--json"], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert "error" in json.loads(p.stdout)


def test_moe_engine_listing_experts_in_its_own_order(tmp_path):
    """An engine that sorts its top-k experts by score: same choices, another order on the k axis."""
    from workbench.diff import run_reference
    model = workbench.load(zoo.build("gemma4_moe", tmp_path / "moe", dtype="float32"))
    ref = run_reference(model, ids=IDS)
    eng, moved = dict(ref.values), 0
    for i in range(model.num_layers):
        idx, scores = eng[f"layers.{i}.router.top_k"], eng[f"layers.{i}.router.proj"]
        q = np.argsort(-np.take_along_axis(scores, idx.astype(np.int64), -1), axis=-1)
        moved += int((q[..., 0] != 0).sum())
        eng[f"layers.{i}.router.top_k"] = np.take_along_axis(idx, q, -1)
        eng[f"layers.{i}.router.weights"] = np.take_along_axis(eng[f"layers.{i}.router.weights"], q, -1)
        for n in ("gate_proj", "up_proj", "act", "down_proj"):
            k = f"layers.{i}.experts.switch_glu.{n}"
            eng[k] = np.take_along_axis(eng[k], q[..., None], -2)
    assert moved > 0  # the engine's order really differs from ours somewhere
    r = compare(model, eng, ids=IDS)
    assert r.first_divergence is None and r.first_local_divergence is None
    assert "top-k order aligned" in r["layers.0.router.top_k"].layout
    assert "aligned to ours" in r["layers.0.experts.switch_glu.down_proj"].layout
    # a wrong expert choice is still a divergence
    bad = dict(eng)
    bad["layers.1.router.top_k"] = (bad["layers.1.router.top_k"] + 1) % 4
    assert compare(model, bad, ids=IDS, local=False).first_divergence.op == "layers.1.router.top_k"


def test_streamed_dump_equals_in_memory_dump(ckpt, reference, tmp_path):
    streamed, smeta = read_dump(reference)  # written by the CLI, op by op
    ref = dump(ckpt, out=tmp_path / "mem.safetensors", ids=IDS)  # written from memory
    mem, mmeta = read_dump(tmp_path / "mem.safetensors")
    assert set(streamed) == set(mem) == set(ref.order)
    assert list(streamed) == ref.order  # the streamed file also stores the tensors in execution order
    for k in mem:
        np.testing.assert_array_equal(streamed[k], mem[k])
    assert {k: v for k, v in smeta.items() if k != "workbench.model"} == \
        {k: v for k, v in mmeta.items() if k != "workbench.model"}


@pytest.mark.parametrize("bug, op, pattern", [
    ("rope", "layers.0.self_attn.q_rope", "grows with the position"),
    ("window", "layers.1.self_attn.softmax", "starts at position 4"),
    ("first", "layers.0.mlp.down_proj", "position 0 alone"),
])
def test_error_by_token_position(tmp_path, bug, op, pattern):
    """The first divergence's error per position tells a RoPE bug from a window/mask bug from a BOS bug."""
    import mlx.core as mx
    from workbench.trace.interventions import patch
    model = workbench.load(zoo.build("llama", tmp_path / "ll", dtype="float32"), attention="explicit")
    pos = lambda v, axis: mx.arange(v.shape[axis])
    fns = {"rope": lambda v, o: v * (1 + 0.05 * pos(v, 2)[None, None, :, None]),          # off by more each position
           "window": lambda v, o: mx.where((pos(v, 2) >= 4)[None, None, :, None], v * 0.5, v),  # wrong from position 4
           "first": lambda v, o: mx.where((pos(v, 1) == 0)[None, :, None], v * 3, v)}          # only the first token
    tr = workbench.trace(model, IDS, capture="full", interventions=[patch(op, fns[bug])])
    tr.run()
    eng = {n: np.array(tr.value(n).astype(mx.float32)) for n in model.program.names}
    r = compare(model, eng, ids=IDS)
    d = r.first_divergence_dict()
    assert d["op"] == op and pattern in d["positions"]["pattern"] and len(d["positions"]["error"]) == len(IDS)
    assert pattern in r.summary()
    clean = compare(model, dump(model, ids=IDS).values, ids=IDS)
    assert all(max(o.position_error) == 0 for o in clean.ops if o.position_error is not None)


def test_dump_with_a_prompt(ckpt, tmp_path, capsys):
    out = tmp_path / "p.safetensors"
    assert main(["dump", str(ckpt), "--prompt", "the quick brown fox", "--out", str(out), "--json",
                 "--ops", "layers.*.mlp.down_proj,logits"]) == 0
    summary = json.loads(capsys.readouterr().out)
    model = workbench.load(ckpt)
    assert summary["ids"] == model.encode("the quick brown fox") and summary["ids"]
    assert summary["names"] == [f"layers.{i}.mlp.down_proj" for i in range(model.num_layers)] + ["logits"]
    values, meta = read_dump(out)
    assert json.loads(meta["workbench.ids"]) == summary["ids"]
    assert values["logits"].shape == (1, len(summary["ids"]), model.vocab_size)


def test_engine_weights_against_the_checkpoint(tmp_path, capsys):
    """Weights an engine dumps next to its activations are compared with the checkpoint's (dequantized)."""
    from workbench.diff import run_reference
    from workbench.plots import weight_values
    ck = zoo.build("qwen3", tmp_path / "q4", quant="affine4")
    model = workbench.load(ck)
    eng = dict(run_reference(model, ids=IDS).values)
    eng["blk.0.ffn_down.weight"] = weight_values(model, "layers.0.mlp.down_proj")  # as loaded: fine
    eng["blk.0.attn_q.weight"] = weight_values(model, "layers.0.self_attn.q_proj").T.copy()  # stored transposed: fine
    up = weight_values(model, "layers.1.mlp.up_proj")
    eng["blk.1.ffn_up.weight"] = np.round(up * 20) / 20  # a wrong dequantization
    rules = [[r"^blk\.(\d+)\.ffn_down\.", r"layers.\1.mlp.down_proj."], [r"^blk\.(\d+)\.attn_q\.", r"layers.\1.self_attn.q_proj."],
             [r"^blk\.(\d+)\.ffn_up\.", r"layers.\1.mlp.up_proj."]]
    r = compare(model, eng, ids=IDS, rules=rules)
    by = {w.name: w for w in r.weights}
    assert set(by) == {"layers.0.mlp.down_proj.weight", "layers.0.self_attn.q_proj.weight", "layers.1.mlp.up_proj.weight"}
    assert by["layers.0.mlp.down_proj.weight"].status == "ok" and by["layers.0.mlp.down_proj.weight"].nmse == 0
    assert by["layers.0.self_attn.q_proj.weight"].status == "ok" and "transposed" in by["layers.0.self_attn.q_proj.weight"].layout
    assert by["layers.1.mlp.up_proj.weight"].status == "diverged"
    assert r.first_divergence is None and r.found and r.first_weight_mismatch.name == "layers.1.mlp.up_proj.weight"
    assert "layers.1.mlp.up_proj.weight differs from the checkpoint" in r.verdict()
    assert r.unmatched_engine == []  # weights are not "unmatched"
    np.savez(tmp_path / "e.npz", **eng)
    (tmp_path / "r.json").write_text(json.dumps(rules))
    rc = main(["diff", str(ck), str(tmp_path / "e.npz"), "--ids", ",".join(map(str, IDS)), "--map", str(tmp_path / "r.json"),
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["first_weight_mismatch"] == "layers.1.mlp.up_proj.weight" and len(out["weights"]) == 3


# ------------------------------------------------------------------ non-finite values, honestly

def test_planted_nan_block_is_reported_in_every_metric_and_view(ckpt, reference, tmp_path, capsys):
    """An engine whose o_proj output holds a NaN tile (tokens 2-4 x channels 8-11, as an aliased
    buffer leaves): no metric of that op looks clean, the report says where, and points to hazards."""
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    target = "layers.1.self_attn.o_proj"
    eng = write_engine(reference, tmp_path / "engine.npz")
    x = eng["blk.1.attn.o_proj"].copy()
    x[2:5, 8:12] = np.nan
    eng["blk.1.attn.o_proj"] = x
    np.savez(tmp_path / "engine.npz", **eng)
    args = ["diff", str(ckpt), str(tmp_path / "engine.npz"), "--ids", ",".join(map(str, IDS)), "--map", str(rules)]
    # the report object
    r = compare(ckpt, tmp_path / "engine.npz", ids=IDS, rules=RULES)
    o = r[target]
    assert r.first_divergence is o and o.status == "diverged"
    for v in (o.cosine, o.nmse, o.max_abs, o.max_rel):
        assert np.isnan(v)
    assert o.nonfinite_engine["nan"] == 12 and o.nonfinite["count"] == 12
    assert o.nonfinite["rows"] == [[2, 4]] and o.nonfinite["channels"] == [[8, 11]] and o.nonfinite["tile"]
    assert o.finite["elements"] == x.size - 12 and o.finite["cosine"] == pytest.approx(1.0, abs=1e-3)
    pe = o.position_error
    assert np.isnan(pe[2:5]).all() and np.isfinite(pe[[0, 1, 5, 6]]).all()  # never 0 beside a NaN
    assert o.nonfinite["per_row"] == [0, 0, 4, 4, 4, 0, 0]
    assert any("non-finite in the engine" in why for why in o.reasons)
    assert o.local_diverged and "non-finite values on one side only" in r.verdict()  # not "local nmse nan"
    # --json: strict JSON, nulls and counts, never a number standing in for the NaN
    assert main(args + ["--json"]) == 1
    raw = capsys.readouterr().out
    assert "NaN" not in raw
    out = json.loads(raw)
    fd = out["first_divergence"]
    assert fd["op"] == target and fd["cosine"] is None and fd["nmse"] is None and fd["max_abs"] is None
    assert fd["nonfinite"]["rows"] == [[2, 4]] and fd["nonfinite"]["channels"] == [[8, 11]]
    assert fd["positions"]["error"][2:5] == [None, None, None] and fd["positions"]["nonfinite"][2:5] == [4, 4, 4]
    row = next(op for op in out["ops"] if op["op"] == target)
    assert row["cosine"] is None and row["max_rel"] is None and row["nonfinite_engine"]["nan"] == 12
    assert row["position_error"][2:5] == [None, None, None] and row["nonfinite"]["count"] == 12
    # text: the row says nan and the count; the where-line names tokens, channels and hazards
    assert main(args + ["--all"]) == 1
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if re.match(rf"\s*\d+\s+{re.escape(target)}\s", ln))
    cells = line.split()
    assert cells[2:6] == ["diverged", "nan", "nan", "nan"] and cells[-2:] == ["12", "<"], line
    assert "tokens 2-4 (3 of 7) x channels 8-11" in text and "workbench hazards" in text
    # the plots draw it (a mark on the curve, a colour on the map)
    from workbench.plots import error_curve, position_error_map
    assert any("non-finite" in t.get_text() for t in error_curve(r).axes[0].get_legend().get_texts())
    assert "non-finite" in position_error_map(r).axes[0].get_title()


def test_reference_side_nan_is_a_finding(ckpt, reference, tmp_path, capsys):
    """Our reference NaN where the engine is finite: a divergence, never "no divergence"."""
    from workbench.diff import write_dump
    values, meta = read_dump(reference)
    order = json.loads(meta["workbench.op_order"])
    bad = dict(values)
    bad["layers.0"] = values["layers.0"].copy()
    bad["layers.0"][0, 3, 5] = np.inf
    write_dump(tmp_path / "ref_nan.safetensors", bad, order, meta)
    eng = {op: values[op] for op in ("embed_tokens", "layers.0", "layers.1")}  # the engine: finite everywhere
    np.savez(tmp_path / "eng.npz", **eng)
    rc = main(["diff", str(tmp_path / "ref_nan.safetensors"), str(tmp_path / "eng.npz"), "--json", "--no-local"])
    out = json.loads(capsys.readouterr().out)
    fd = out["first_divergence"]
    assert rc == 1 and fd["op"] == "layers.0" and fd["cosine"] is None
    assert any("non-finite in the reference, finite in the engine" in w for w in fd["reasons"])
    assert fd["nonfinite"]["reference"] == 1 and fd["nonfinite"]["engine"] == 0
    assert fd["nonfinite"]["rows"] == [[3, 3]] and fd["nonfinite"]["channels"] == [[5, 5]]
    assert not fd["nonfinite"]["tile"]  # one element is no block: no hazards hint
    rc = main(["diff", str(tmp_path / "ref_nan.safetensors"), str(tmp_path / "eng.npz"), "--no-local"])
    text = capsys.readouterr().out
    assert rc == 1 and "first divergence: layers.0" in text and "no divergence" not in text
    assert "workbench hazards" not in text


@pytest.mark.parametrize("ids", ['"abc"', "[1, -2]", "[]", "{not json", "[1.5]"])
def test_reference_dump_with_bad_ids_metadata_is_one_line(reference, tmp_path, capsys, ids):
    from workbench.diff import write_dump
    values, meta = read_dump(reference)
    write_dump(tmp_path / "ref.safetensors", values, json.loads(meta["workbench.op_order"]),
               dict(meta, **{"workbench.ids": ids}))
    np.savez(tmp_path / "eng.npz", **{"layers.0": values["layers.0"]})
    assert main(["diff", str(tmp_path / "ref.safetensors"), str(tmp_path / "eng.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "workbench.ids is not a list of token ids" in err
