"""Rounding or a bug (issue 39): each op's local error held to its own rounding budget.

The engines are transformers (torch) dumps in tests/data/engines (scripts/make_engine_dumps.py);
some bugs are planted here in a clean dump, at one op, computed the way an engine would
compute them from its own inputs (the ops after it left clean: the local verdict is local).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.diff import budget, compare
from workbench.diff.local import MAX_SEGMENT, segment
from workbench.diff.readers import read_dump

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "engines"
sys.path.insert(0, str(HERE / "data"))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from make_arch_refs import HERE as ARCHS, write_checkpoint

    root = tmp_path_factory.mktemp("budget")
    return {c: str(write_checkpoint(root / c, ARCHS / c)) for c in ("llama", "gemma3_text")}


def dump(name):
    eng, meta = read_dump(DATA / f"{name}.safetensors")
    return eng, json.loads(meta["workbench.ids"])


def bf16(a):
    a = np.ascontiguousarray(a, np.float32)
    b = a.view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).view(np.float32)  # round to nearest even


# ------------------------------------------------------------------ reading precision from values

def test_value_precision_reads_the_coarsest_exact_format():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(256).astype(np.float32)
    assert budget.value_precision(x) == "float32"
    assert budget.value_precision(bf16(x)) == "bfloat16"
    assert budget.value_precision(x.astype(np.float16).astype(np.float32)) == "float16"
    assert budget.value_precision(np.arange(64, dtype=np.float32)) is None  # indices say nothing
    assert budget.value_precision(x[:8]) is None                            # too few values
    with_nan = x.copy()
    with_nan[3] = np.nan
    assert budget.value_precision(bf16(with_nan)) == "bfloat16"            # non-finite values left out


def test_an_op_takes_the_precision_of_its_kind():
    rng = np.random.default_rng(1)
    x = [rng.standard_normal(64).astype(np.float32) for _ in range(6)]
    tensors = {"a.linear": bf16(x[0]), "b.linear": bf16(x[1]), "c.linear": x[2], "a.norm": x[3], "b.norm": x[4]}
    kinds = {"a.linear": "linear", "b.linear": "linear", "c.linear": "linear", "a.norm": "norm", "b.norm": "norm",
             "rope": "rope"}
    p = budget.engine_precision(tensors, kinds)
    assert p.source == "values" and p.counts == {"bfloat16": 2, "float16": 0, "float32": 3}
    assert p.of("c.linear") == "bfloat16" and p.of("a.norm") == "float32"  # a mixed engine: by kind
    assert p.of("rope") == "float32"                                       # no tensor of its kind: the engine's
    forced = budget.engine_precision(tensors, kinds, given="bf16")
    assert forced.source == "option" and {forced.of(n) for n in kinds} == {"bfloat16"}
    meta = budget.engine_precision(tensors, kinds, metadata="float16")
    assert meta.source == "metadata" and meta.of("rope") == "float16" and meta.of("a.norm") == "float32"
    with pytest.raises(ValueError, match="use one of"):
        budget.parse_precision("int8")


def test_judge_floors_the_budget_at_one_rounding():
    u2 = budget.floor_power("bfloat16")
    assert budget.judge(0.0, 0.0, "bfloat16") == (0.0, False)
    ratio, beyond = budget.judge(budget.FACTOR * u2 * 1.01, 0.0, "bfloat16")
    assert beyond and ratio == pytest.approx(budget.FACTOR * 1.01)
    assert budget.judge(1e-3, 1e-4, "float32") == (pytest.approx(10.0), False)
    assert u2 == 2.0 ** -16  # one rounding's worst case on every element
    assert budget.sqnr_db(1e-4) == pytest.approx(40.0) and budget.sqnr_db(None) is None


# ------------------------------------------------------------------ clean engines and planted bugs

@pytest.mark.parametrize("name,case", [("llama_clean", "llama"), ("gemma3_clean", "gemma3_text")])
def test_clean_float32_engines_are_within_their_budget(ckpt, name, case):
    eng, ids = dump(name)
    r = compare(ckpt[case], eng, ids=ids, engine_adapter="transformers")
    assert r.clean and r.engine_precision.engine == "float32"
    judged = [o for o in r.ops if o.local_rule == "budget"]
    assert len(judged) >= 0.8 * r.compared
    assert max(o.ratio for o in judged) < budget.FACTOR / 2  # (margin: the largest clean ratio is ~6)


def test_float32_engine_with_one_matmul_accumulated_in_bfloat16(ckpt):
    """The issue's repro: 5e-5 nmse at down_proj, 'no divergence' under fixed limits."""
    eng, ids = dump("llama_bf16_down")
    r = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers")
    fl = r.first_local_divergence
    assert fl.op == "layers.1.mlp.down_proj" and fl.local_rule == "budget"
    assert fl.precision == "float32" and fl.ratio > 1e6  # the odd one out of its kind: held to float32
    assert "x the float32 rounding" in r.verdict()


def _rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w).astype(np.float32)


@pytest.mark.parametrize("round_to", [None, bf16], ids=["float32", "bfloat16"])
def test_a_norm_eps_bug_is_named_at_that_norm(ckpt, round_to):
    """Layer 1's input_layernorm with eps 0.1 (the checkpoint says 1e-6): in a float32 engine
    (the issue's repro: 9.5e-5 local nmse, 'no divergence') and in a bfloat16 one."""
    import safetensors.numpy

    eng, ids = dump("llama_clean")
    if round_to is not None:
        eng = {k: round_to(v) for k, v in eng.items()}
    w = safetensors.numpy.load_file(str(Path(ckpt["llama"]) / "model.safetensors"))
    name = next(k for k in eng if k.endswith("layers.1.input_layernorm"))
    x = eng[next(k for k in eng if k.endswith("layers.0") or k.endswith("layers.0.output"))]
    bad = _rms_norm(x, w["model.layers.1.input_layernorm.weight"], 0.1)
    eng[name] = bad if round_to is None else round_to(bad)
    r = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers")
    assert r.first_local_divergence is not None and r.first_local_divergence.op == "layers.1.input_layernorm", \
        r.summary()
    assert r.first_local_divergence.local_rule == "budget"
    clean = compare(ckpt["llama"], {k: (round_to(v) if round_to else v) for k, v in dump("llama_clean")[0].items()},
                    ids=ids, engine_adapter="transformers")
    assert clean.clean and clean.engine_precision.engine == ("float32" if round_to is None else "bfloat16")


def test_an_undumped_input_is_recomputed_through_our_program(ckpt):
    """down_proj without mlp.act dumped: act is recomputed from gate_proj and up_proj (a segment)."""
    eng, ids = dump("llama_bf16_down")
    act = [k for k in eng if k.endswith(("mlp.act_fn", "mlp.down_proj#input"))]  # (act, as the hooks name it)
    assert len(act) == 4, sorted(eng)
    for k in act:
        del eng[k]
    r = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers")
    fl = r.first_local_divergence
    assert fl.op == "layers.1.mlp.down_proj" and fl.recomputed == ["layers.1.mlp.act"]
    assert "layers.1.mlp.act recomputed" in r.verdict()


def test_segment_bounds(ckpt):
    import workbench

    prog = workbench.load(ckpt["llama"]).program
    have = {"embed_tokens", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj"}
    assert segment(prog, "layers.0.mlp.down_proj", have) == ["layers.0.mlp.act", "layers.0.mlp.down_proj"]
    assert segment(prog, "embed_tokens", have) is None          # input_ids is neither fed here nor dumped
    assert segment(prog, "logits", {"embed_tokens", "input_ids"}) is None  # more than MAX_SEGMENT ops
    assert MAX_SEGMENT < len(prog.ops)


def test_engine_dtype_option(ckpt, capsys):
    """--engine-dtype bfloat16 on the float32 engine: every op held to bfloat16's rounding, the
    bfloat16-accumulated matmul within it; a bad value is one line, exit 2."""
    path = str(DATA / "llama_bf16_down.safetensors")
    assert main(["diff", ckpt["llama"], path, "--engine", "transformers", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["engine_precision"]["engine"] == "float32" and out["engine_precision"]["source"] == "metadata"
    op = next(o for o in out["ops"] if o["op"] == "layers.1.mlp.down_proj")
    assert op["local_rule"] == "budget" and op["ratio"] > 1e6 and op["local_sqnr_db"] < 50
    assert main(["diff", ckpt["llama"], path, "--engine", "transformers", "--engine-dtype", "bfloat16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine_precision"]["source"] == "option" and out["first_local_divergence"] is None
    assert main(["diff", ckpt["llama"], path, "--engine-dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--engine-dtype" in err[0]


def test_summary_shows_the_budget(ckpt):
    eng, ids = dump("llama_bf16_down")  # (a mapping: no metadata)
    text = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers").summary()
    assert "engine precision: float32 (read from the values; tensors: 1 bfloat16, 37 float32)" in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#  op"))
    assert header.split()[-4:] == ["budget", "x", "budget", "non-finite"]
    row = next(line for line in text.splitlines() if line.split()[:2][-1:] == ["layers.1.mlp.down_proj"])
    assert row.split()[-1] == "<" and float(row.split()[-2]) > 1e6  # (x budget, then the mark)


# ------------------------------------------------------------------ decode steps recognised

def test_a_decode_dump_needs_no_flag(ckpt):
    eng, ids = dump("llama_decode_kv_off")  # (a mapping: no metadata says it is a decode step)
    r = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers")
    assert r.decode and "read as one decode step" in r.decode_note and "1 position" not in r.decode_note
    assert r.first_divergence.op == "layers.0.self_attn.q_rope"
    clean, ids = dump("llama_decode_clean")
    assert compare(ckpt["llama"], clean, ids=ids, engine_adapter="transformers").clean
    # any residual-stream op tells: here layer 1's output alone (embed_tokens and layer 0's dropped)
    later = {k: v for k, v in clean.items() if not k.endswith(("embed_tokens", "layers.0"))}
    r = compare(ckpt["llama"], later, ids=ids, engine_adapter="transformers")
    assert r.clean and r.decode and "'layers.1' holds one position" in r.decode_note


def test_another_position_count_is_one_line_naming_both(ckpt, tmp_path, capsys):
    path = str(DATA / "llama_clean.safetensors")
    assert main(["diff", ckpt["llama"], path, "--engine", "transformers", "--ids", "3,17,42,7,99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 7 positions' values" in err[0] and "5" in err[0] and "--decode" in err[0]


# ------------------------------------------------------------------ shown where people look

def test_plot_and_diffview_show_the_budget(ckpt):
    from workbench.plots import error_curve
    from workbench.widgets import DiffView

    eng, ids = dump("llama_bf16_down")
    r = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers")
    ax = error_curve(r).axes[0]
    labels = [h.get_label() for h in ax.get_legend_handles_labels()[0]]
    assert any(lbl.startswith(f"rounding budget .. {budget.FACTOR:g}x") for lbl in labels), labels
    assert any("first local divergence: layers.1.mlp.down_proj" in lbl for lbl in labels), labels
    v = DiffView(r)
    assert "local-nmse" in v.metrics.value and "engine precision: float32" in v.summary.value
    v.show("layers.1.mlp.down_proj")
    html = "".join(o.get("data", {}).get("text/html", "") for o in v.detail.outputs)
    assert "x budget" in html and "budget rule: beyond" in html and "rounding budget" in html
    v.show("layers.1.mlp.up_proj")
    html = "".join(o.get("data", {}).get("text/html", "") for o in v.detail.outputs)
    assert "budget rule: within" in html


# ------------------------------------------------------------------ quantized checkpoints

@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_quantized_checkpoint_format_error_is_in_the_budget_a_dequantization_bug_is_not(dtype):
    """demo-4bit (affine, 4 bits, groups of 32) run as the engine: clean, since the quantization
    is the checkpoint's own (both recomputes dequantize as it says; in float32 the quantized
    matmul has no float64 kernel, so float32 stands for exact and the floor is the budget); the
    same engine whose layer-1 q_proj dequantizes without the affine biases is named at that op."""
    import dataclasses

    import mlx.core as mx

    import workbench
    from workbench.program import Program, execute

    path = str(HERE.parent / "assets" / "demo-4bit")
    model = workbench.load(path)
    ids = model.encode("apple river stone cloud tree | apple river stone")

    def wrong_q(ctx, x):
        W = ctx.weights
        n = "layers.1.self_attn.q_proj"
        w = mx.dequantize(W[n + ".weight"], W[n + ".scales"], mx.zeros_like(W[n + ".biases"]),
                          group_size=32, bits=4)  # (the bug: the biases left out)
        return x @ w.T.astype(x.dtype)

    def engine(bug):
        ops = [dataclasses.replace(op, fn=wrong_q) if bug and op.name == "layers.1.self_attn.q_proj" else op
               for op in model.program.ops]
        vals = execute(Program(ops, model.program.inputs), model.context(dtype),
                       model.feeds(mx.array([ids])), keep=lambda n: True)
        return {k: np.array(v.astype(mx.float32)) for k, v in vals.items() if k in model.program.names}

    clean = compare(path, engine(False), ids=ids)
    assert clean.clean and clean.engine_precision.engine == dtype
    assert max(o.ratio for o in clean.ops if o.local_rule == "budget") < budget.FACTOR / 2
    bad = compare(path, engine(True), ids=ids)
    fl = bad.first_local_divergence
    assert fl.op == "layers.1.self_attn.q_proj" and fl.local_rule == "budget" and fl.ratio > 100 * budget.FACTOR
