"""Notebook 06 (engine diff): the exercises, their answers and their hints."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, array, register, value

OPS = ["embed_scale", "layers.0.input_layernorm", "layers.0.self_attn.q_proj", "layers.1.mlp.act",
       "layers.1.mlp.down_proj", "layers.2", "layers.3.self_attn.o_proj", "logits"]


@lru_cache(maxsize=None)
def _pairs():
    """(reference, engine) value pairs of a few ops: an engine whose error grows op by op."""
    rng = np.random.default_rng(0)
    tr = fx.trace()
    out = []
    for i, n in enumerate(OPS):
        ref = np.array(tr.value(n)[0], dtype=np.float32)
        eng = ref + np.float32(10.0 ** (i - 6)) * rng.standard_normal(ref.shape).astype(np.float32) * ref.std()
        out.append((ref, eng + np.float32(0.01 * i)))
    return out


NAMES = {"attn_norm": "input_layernorm", "attn_out": "self_attn.o_proj", "ffn_inp": "attn_residual",
         "ffn_act": "mlp.act", "ffn_out": "mlp.down_proj", "l_out": ""}   # notebook 06's engine names


@lru_cache(maxsize=None)
def _one_bad_engine() -> tuple[bool, str | None]:
    """Notebook 06's subtler engine (SiLU in layer 2's activation only, bfloat16), dumped under
    its own names and diffed: (found a divergence by default, first divergence with a noise floor)."""
    import dataclasses
    import tempfile
    from pathlib import Path

    import mlx.core as mx
    import mlx.nn as nn

    from workbench.demo.paths import DEMO
    from workbench.diff import compare
    from workbench.models import load
    from workbench.program import Program, execute

    model = load(DEMO, attention="explicit")
    ids = model.encode(fx.COPY_PROMPT)
    ops = [dataclasses.replace(op, fn=lambda ctx, gate, up: nn.silu(gate) * up) if op.name == "layers.2.mlp.act" else op
           for op in model.program.ops]
    vals = execute(Program(ops, model.program.inputs), model.context("bfloat16"), model.feeds(mx.array([ids])),
                   keep=lambda n: True)
    vals = {k: np.array(v.astype(mx.float32))[0] for k, v in vals.items() if k in model.program.names}
    dump = {"tok_embd": vals["embed_scale"], "result_output": vals["logits"]}
    for i in range(model.num_layers):
        for theirs, ours in NAMES.items():
            dump[f"blk.{i}.{theirs}"] = vals[f"layers.{i}" + (f".{ours}" if ours else "")]
    path = Path(tempfile.mkdtemp()) / "engine_one_bad.npz"
    np.savez(path, **dump)
    rules = [[r"^tok_embd$", "embed_scale"], [r"^result_output$", "logits"], [r"^blk\.(\d+)\.l_out$", r"layers.\1"]] + \
        [[rf"^blk\.(\d+)\.{theirs}$", rf"layers.\1.{ours}"] for theirs, ours in NAMES.items() if ours]
    loose = compare(model, path, ids=ids, rules=rules, dtype="float32")
    tight = compare(model, path, ids=ids, rules=rules, noise_floor="bfloat16")
    return loose.first_divergence is not None, tight.first_divergence.op if tight.first_divergence else None


def _metric_case(key):
    from workbench.diff.metrics import error_metrics

    pairs = _pairs()
    return (pairs,), np.array([error_metrics(r, e)[key] for r, e in pairs])


def _each(f):
    return lambda pairs: np.array([f(r.astype(np.float64), e.astype(np.float64)) for r, e in pairs])


register(
    Exercise(
        "06.1", "predict", "True or False",
        value("one layer's error: how large is it against the default NMSE <= 0.01? The error curve above helps",
              mistakes=[(True, "read the error curve above: how far is one wrong layer's NMSE from the default limit?")]),
        expected=lambda: _one_bad_engine()[0],
        solution="""one_bad = run_engine_one_bad("layers.2.mlp.act")     # SiLU in layer 2 only
write_dump(one_bad, work / "engine_one_bad.npz")
loose = compare(model, work / "engine_one_bad.npz", ids=ids, rules=rules, dtype="float32")
loose.first_divergence is not None
# one wrong activation moves that op's NMSE less than the default 0.01, and the model still
# answers ' cloud': a plausible engine with a real bug"""),
    Exercise(
        "06.2", "predict", "an op name",
        value("the noise floor holds each op to 10x the error of a correct bfloat16 run: which op is wrong first?",
              mistakes=[("layers.2.mlp.down_proj", "that op reads the wrong one: with a noise floor the diff can name the wrong op itself"),
                        ("logits", "the noise floor is per op: it does not wait for the logits")]),
        expected=lambda: _one_bad_engine()[1],
        solution="""tight = compare(model, work / "engine_one_bad.npz", ids=ids, rules=rules, noise_floor="bfloat16")
tight.first_divergence.op
# exactly the wrong op: measured against the error a correct bfloat16 run makes at each op,
# its departure is far beyond the noise"""),
    Exercise(
        "06.3", "implement", "a function nmse(ref, got) returning a number",
        array("ops", "reread the definition of nmse under \"The diff\": what is averaged, and what is it divided by?",
              mistakes=[(_each(lambda r, e: ((e - r) ** 2).mean() / (r ** 2).mean()),
                         "that divides by the reference's mean square (its power); NMSE divides by its variance, the spread around its mean"),
                        (_each(lambda r, e: ((e - r) ** 2).mean() / e.var()),
                         "normalise by the *reference's* variance, not the engine's"),
                        (_each(lambda r, e: ((e - r) ** 2).mean()), "that is the error before it is normalised: the definition under \"The diff\" says what to divide by")],
              rtol=1e-3, atol=1e-12),
        case=lambda: _metric_case("nmse"), call=lambda fn, pairs: [float(fn(r, e)) for r, e in pairs],
        solution="""def nmse(ref, got):
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return ((got - ref) ** 2).mean() / ref.var()"""),
    Exercise(
        "06.4", "implement", "a function cosine(ref, got) returning a number",
        array("ops", "the dot product of the two flattened tensors, divided by both their lengths",
              mistakes=[(_each(lambda r, e: float((r * e).sum())), "now divide by both vectors' lengths (np.linalg.norm)"),
                        (_each(lambda r, e: 1 - (r * e).sum() / np.linalg.norm(r) / np.linalg.norm(e)),
                         "that is 1 - cosine (a distance); the diff reports the cosine itself")],
              rtol=1e-6, atol=1e-7),
        case=lambda: _metric_case("cosine"), call=lambda fn, pairs: [float(fn(r, e)) for r, e in pairs],
        solution="""def cosine(ref, got):
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    return r @ g / (np.linalg.norm(r) * np.linalg.norm(g))"""),
)
