"""Rounding or a bug?  Each op's rounding budget, measured on the engine's own inputs.

An engine that computes in bfloat16 lands ~1e-5 (nmse) from the exact op at every step; one
that computes in float32, ~1e-14.  A fixed limit cannot serve both: bfloat16-sized limits
pass a float32 engine's real bugs (a norm eps, a matmul accumulated in bfloat16), float32-
sized ones flag every honest bfloat16 kernel.  So each op is held to its own budget:

* **the op's precision**: read from the values, because hooks save every tensor as float32
  and say nothing of the engine.  Each tensor's is the coarsest float format all its values
  are exact in (``bfloat16``, ``float16``, else ``float32``; :func:`value_precision`); an op
  takes the precision most ops *of its kind* are in (a mixed engine's matmuls in bfloat16,
  its norms in float32), and the engine's (its tensors' majority, or its metadata's) where
  none of its kind tells.  So a float32 engine whose one matmul of fourteen came out in
  bfloat16 holds that matmul to float32's rounding: the odd one out is the finding.
  ``--engine-dtype`` sets one precision for every op.
* **two recomputes of our op on the engine's own inputs** (local.py): *exact* in a finer
  format (float32 for a bfloat16/float16 op, float64 on the CPU for a float32 op) and
  *honest* at the op's precision (inputs rounded to it, weights cast to it, MLX's kernels:
  float32 accumulation in matmuls).  The **budget** is how far the honest recompute lands
  from the exact one; the op's **local error** is how far the engine lands from it.
* Both as nmse against the exact value's power (``MSE / mean(exact^2)``, i.e. the SQNR
  engines are used to: :func:`sqnr_db`), the budget never below one rounding of every
  element (``u^2``, u the unit roundoff: :func:`floor_power`).  **ratio** = local / budget;
  the op is beyond its rounding when the ratio exceeds :data:`FACTOR`.

:data:`FACTOR` is calibrated on clean engines of every precision (transformers in float32,
bfloat16 and float16 on Llama, Qwen 3, Gemma 3 and Gemma 4: tests/data/engines/precision,
docs/diff.md "Rounding budget" for the figures): another honest implementation differs
from ours by its own order of operations, not by orders of magnitude.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

#: the float formats an engine computes in, coarsest first
PRECISIONS = ("bfloat16", "float16", "float32")
#: significand bits, the implicit one included: the unit roundoff is 2^-BITS
BITS = {"bfloat16": 8, "float16": 11, "float32": 24, "float64": 53}
#: the format the *exact* recompute of an op of each precision runs in
FINER = {"bfloat16": "float32", "float16": "float32", "float32": "float64"}
#: an op is beyond its rounding when its local error exceeds FACTOR x its budget
FACTOR = 16.0
#: where no recompute is possible (inputs neither dumped nor recomputable: llama.cpp's printed
#: text), an op whose error (nmse against the reference) is this many times its nearest compared
#: inputs' is a finding: 30 dB, orders of magnitude beyond what one op's amplification of its
#: inputs' error does on clean runs (real llama.cpp dumps: at most 22x; a wrong RoPE base: 2e6x)
GROWTH = 1e3
#: fewer finite values than this say nothing of a tensor's precision
MIN_VALUES = 16


def unit_roundoff(precision: str) -> float:
    return 2.0 ** -BITS[precision]


def floor_power(precision: str) -> float:
    """The least budget of any op at ``precision``: every element off by one rounding's worst
    case (``|relative error| <= u``: ``u^2`` of the power).  Not less: the exact recompute of a
    float32 op is only as exact as MLX's float64 kernels, and on the CPU ``fast.rms_norm``,
    ``fast.rope``, attention and softmax compute float64 input in float32 inside (measured
    with MLX 0.32: errors of 5e-8 .. 5e-7 against numpy's float64), so a float32 op's measured
    budget can be nothing while another honest float32 engine lands a rounding or two away."""
    return unit_roundoff(precision) ** 2


def sqnr_db(power: float | None) -> float | None:
    """Signal-to-quantization-noise ratio in dB of an error power (``MSE / mean(ref^2)``)."""
    if power is None or math.isnan(power):
        return None
    if power <= 0:
        return math.inf
    return -10.0 * math.log10(power)


def value_precision(a: np.ndarray) -> str | None:
    """The coarsest of bfloat16, float16, float32 in which every finite value of ``a`` is exact;
    None when it has fewer than :data:`MIN_VALUES` finite values or only integers (indices,
    masks: exact in every format, so they say nothing)."""
    x = np.asarray(a)
    if x.dtype != np.float32:
        if not np.issubdtype(x.dtype, np.floating):
            return None
        x = x.astype(np.float32)
    x = x[np.isfinite(x)]
    if x.size < MIN_VALUES or bool(np.all(x == np.round(x))):
        return None
    if not np.any(x.view(np.uint32) & 0xFFFF):
        return "bfloat16"
    with np.errstate(over="ignore"):
        if np.array_equal(x.astype(np.float16).astype(np.float32), x):
            return "float16"
    return "float32"


@dataclass
class EnginePrecision:
    """What precision each of the engine's tensors is in, and the engine's own.

    ``engine``: the precision of most of its tensors (or the one given); ``source``:
    ``"values"``, ``"metadata"`` or ``"option"`` (``--engine-dtype``); ``counts``: tensors per
    precision read from the values; ``by_kind``: op kind -> the precision most of its ops
    are in; ``kinds``: op -> its kind.  :meth:`of`: an op's precision."""

    engine: str
    source: str
    counts: dict = field(default_factory=dict)
    by_kind: dict = field(default_factory=dict)
    kinds: dict = field(default_factory=dict)

    def of(self, op: str) -> str:
        if self.source == "option":
            return self.engine
        return self.by_kind.get(self.kinds.get(op)) or self.engine

    def to_dict(self) -> dict:
        return {"engine": self.engine, "source": self.source, "counts": dict(self.counts),
                "by_kind": dict(self.by_kind), "factor": FACTOR}

    def text(self) -> str:
        how = {"values": "read from the values", "metadata": "the dump's metadata says so",
               "option": "--engine-dtype"}[self.source]
        counts = ", ".join(f"{n} {p}" for p, n in self.counts.items() if n)
        return (f"engine precision: {self.engine} ({how}{'; tensors: ' + counts if counts else ''}); "
                f"each op is held to {FACTOR:g} x its rounding at that precision")


def parse_precision(name) -> str | None:
    """``--engine-dtype`` / metadata values: one of :data:`PRECISIONS` (aliases bf16, fp16, fp32)."""
    if name is None:
        return None
    from workbench.dtypes import dtype_name

    key = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "f32": "float32"}.get(
        dtype_name(name), dtype_name(name))
    if key not in PRECISIONS:
        raise ValueError(f"engine dtype {name!r}: use one of {', '.join(PRECISIONS)}")
    return key


def _majority(counts: Mapping[str, int]) -> str | None:
    """The precision with the most tensors (the finer on a tie), None for no tensor."""
    if not any(counts.values()):
        return None
    return max(PRECISIONS, key=lambda q: (counts.get(q, 0), BITS[q]))


def engine_precision(tensors: Mapping[str, np.ndarray], kinds: Mapping[str, str],
                     given: str | None = None, metadata: str | None = None) -> EnginePrecision:
    """The precision of each kind of op from the engine's values (``kinds``: op -> its kind),
    and the engine's: ``given`` (an option), else the dump's ``metadata``, else the most
    common among its tensors."""
    counts = {p: 0 for p in PRECISIONS}
    per_kind: dict[str, dict[str, int]] = {}
    for name, a in tensors.items():
        p = value_precision(a)
        if p is not None:
            counts[p] += 1
            k = per_kind.setdefault(kinds.get(name, ""), {})
            k[p] = k.get(p, 0) + 1
    by_kind = {k: _majority(c) for k, c in per_kind.items()}
    if given is not None:
        return EnginePrecision(parse_precision(given), "option", counts, by_kind, dict(kinds))
    if metadata is not None:
        try:
            p = parse_precision(metadata)
        except ValueError:
            p = None
        if p is not None:
            return EnginePrecision(p, "metadata", counts, by_kind, dict(kinds))
    return EnginePrecision(_majority(counts) or "float32", "values", counts, by_kind, dict(kinds))


def limit(budget_power: float | None, precision: str) -> float:
    """The local error power an op at ``precision`` may reach: FACTOR x its budget, floored."""
    budget = budget_power if budget_power is not None and not math.isnan(budget_power) else 0.0
    return FACTOR * max(budget, floor_power(precision))


def judge(local_power: float | None, budget_power: float | None, precision: str) -> tuple[float | None, bool]:
    """(ratio of the local error to the budget, beyond it?) for one op at ``precision``."""
    if local_power is None or math.isnan(local_power):
        return None, False
    ratio = local_power / (limit(budget_power, precision) / FACTOR)
    return ratio, ratio > FACTOR
