"""Notebook 04 (NaN hunt): the exercises, their answers and their hints."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, array, fields, register, value

SPOT = (0, 3, 0)   # token 3, channel 0 of layers.0, as in the notebook


@lru_cache(maxsize=None)
def _poisoned_f16() -> tuple[str, str]:
    """Notebook 04's poisoned demo (NaN at layers.2.mlp.down_proj.weight[7, 3]) hunted in float16."""
    import tempfile
    from pathlib import Path

    import mlx.core as mx

    from workbench.demo.paths import DEMO
    from workbench.models import load
    from workbench.notebook import planted
    from workbench.trace import hunt

    def poison(ts):
        k = next(k for k in ts if k.endswith("layers.2.mlp.down_proj.weight"))
        w = np.array(ts[k].astype(mx.float32))
        w[7, 3] = np.nan
        ts[k] = mx.array(w).astype(ts[k].dtype)

    bad = load(planted(DEMO, Path(tempfile.mkdtemp()) / "poisoned", poison))
    f = hunt(bad, fx.RECALL_PROMPT, dtype="float16").finding
    return f.op, f.cause


def _nan_count(what: float) -> int:
    return int(fx.injected("layers.0", what, SPOT).stats("layers.1.input_layernorm")["nan"])


def _norm_case():
    tr = fx.injected("layers.0", float("inf"), SPOT)
    w = fx.weight(fx.demo(), "layers.1.input_layernorm.weight")
    return (fx.v(tr, "layers.0"), w, fx.demo().config.get("rms_norm_eps", 1e-6)), fx.v(tr, "layers.1.input_layernorm")


def _rms(x, w, eps):
    with np.errstate(all="ignore"):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def _first_case():
    tr = fx.injected("layers.1.mlp.act", float("inf"), SPOT)
    names = [n for n in fx.demo().program.names]
    values = {n: np.array(tr.value(n)) for n in names}
    first = next(n for n in names if not np.isfinite(values[n]).all())
    return (names, values), first


def _first_nan(names, values):
    return next((n for n in names if np.isnan(values[n]).any()), None)


def _last_bad(names, values):
    return next((n for n in reversed(names) if not np.isfinite(values[n]).all()), None)


register(
    Exercise(
        "04.1", "predict", '(op name, cause), e.g. ("layers.1.mlp.act", "overflow")',
        fields(("op", "cause"),
               ("float16 only changes the range: does anything before the poisoned weight come near 65504?",
                "the hunt checks an op's weights before it blames the arithmetic"),
               swapped="the op and the cause are swapped: (op name, cause)"),
        expected=_poisoned_f16,
        solution="""f16 = hunt(bad, prompt, dtype="float16").finding
f16.op, f16.cause
# the same op and cause as in float32: nothing before it comes near float16's limit"""),
    Exercise(
        "04.2", "predict", "a number",
        value("the norm divides each token's vector by that token's RMS: which tokens, how many channels?",
              mistakes=[(1, "the NaN enters the token's RMS, and every channel of that token is divided by it"),
                        (lambda e, a: e * 10, "only token 3's RMS is NaN: the other tokens are normed on their own")]),
        expected=lambda: _nan_count(float("nan")),
        solution="""t.stats("layers.1.input_layernorm")["nan"]
# one token's whole vector (the model's width): that token's RMS is NaN and every channel is divided by it""",
        giveaways=(f"{'layers.1.input_layernorm':28s} ", "makes that token's whole vector NaN")),
    Exercise(
        "04.3", "predict", "a number",
        value("the RMS of a vector holding inf is inf: what is inf / inf, and what is 2.5 / inf?",
              mistakes=[(lambda e, a: _nan_count(float("nan")), "an inf is not a NaN: finite / inf is 0, only inf / inf is NaN"),
                        (0, "inf / inf is not a number")]),
        expected=lambda: _nan_count(float("inf")),
        solution="""t_inf = workbench.trace(model, prompt, capture="stats",
                        interventions=[inject("layers.0", float("inf"), index=(0, 3, 0))])
t_inf.run()
t_inf.stats("layers.1.input_layernorm")["nan"]
# the RMS is +inf: channel 0 becomes inf / inf = NaN, every other channel of token 3 finite / inf = 0"""),
    Exercise(
        "04.4", "implement", "a function rms_norm(x, weight, eps) returning an array shaped like x",
        array("tokens", "divide each token's vector by the root of its mean square (plus eps), then scale by the weight",
              mistakes=[(lambda x, w, e: _rms(x, 1.0, e), "the normalisation is right; now multiply by the weight"),
                        (lambda x, w, e: _rms(x, 1.0 + w, e), "this Gemma stores the weight itself: multiply by weight, not 1 + weight"),
                        (lambda x, w, e: x / (np.abs(x).mean(-1, keepdims=True) + e) * w, "that divides by the mean *absolute* value: RMS is the root of the mean of squares")]),
        case=_norm_case,
        solution="""def rms_norm(x, weight, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * weight
# on the token holding +inf: inf / inf = NaN in that channel, finite / inf = 0 elsewhere"""),
    Exercise(
        "04.5", "implement", "a function first_nonfinite(names, values) returning an op name",
        value("walk the ops in order and stop at the first value that is not all finite",
              mistakes=[(lambda e, a: _first_nan(*a), "an infinity is non-finite too: test np.isfinite, not only np.isnan"),
                        (lambda e, a: _last_bad(*a), "that is the *last* non-finite op: the first one is where the trouble starts")]),
        case=_first_case,
        solution="""def first_nonfinite(names, values):
    for n in names:                                   # in execution order
        if not np.isfinite(values[n]).all():          # NaN or +-inf
            return n"""),
)
