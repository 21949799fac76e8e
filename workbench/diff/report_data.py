"""The diff's report: every matched op (:class:`OpDiff`), the first divergence, the coverage and the verdict.

:class:`DiffReport` holds what the diff found, in our execution order, and reads it: the first
divergence (where the bug *shows*), the first op wrong on the engine's own inputs (where it
*is*), whether enough of the engine's dump was compared to vouch for it (:data:`MIN_COVERAGE`),
the one-sentence verdict, and ``to_dict()`` (the CLI's --json).  It is built by
:func:`workbench.diff.report.compare_arrays` (and completed by ``workbench.diff.compare``);
its text summary is workbench/diff/report_text.py.  Both classes stay importable from
workbench.diff.report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.arrays import finite_or_none as _num
from workbench.diff.budget import sqnr_db
from workbench.diff.metrics import Tolerance
from workbench.diff.report_text import summary_text
from workbench.diff.where import position_pattern

#: the share of the engine's tensors (those the rules do not drop) that must be compared before
#: the diff says "no divergence": below it, the answer is exit 1 and the names to map
#: (docs/diff.md, "Coverage")
MIN_COVERAGE = 0.5


def _local(o: "OpDiff") -> str:
    """The local error in words: its nmse, or what its NaN means."""
    if o.local_rule == "growth":
        return (f"its error grew {o.ratio:.3g}x over its nearest compared inputs' (nmse {o.nmse:.3g}; its inputs "
                "were not dumped and could not be recomputed, so the growth decides)")
    x = o.local_nmse
    if x is not None and not math.isnan(x):
        if o.local_rule == "budget" and o.ratio is not None:
            seg = f", {' -> '.join(o.recomputed)} recomputed" if o.recomputed else ""
            return (f"local nmse {x:.3g}, {o.ratio:.3g} x the {o.precision} rounding of this op"
                    f"{' (within it)' if not o.local_diverged else ''}{seg}")
        return f"local nmse {x:.3g}"
    if o.local_diverged:
        return "local: non-finite values on one side only, where the other is finite"
    return "local: non-finite on both sides, as the engine's inputs are"


@dataclass
class OpDiff:
    """One of our ops matched with an engine tensor."""

    op: str
    engine_name: str
    index: int  # position in our execution order
    layer: int | None
    status: str  # "ok" | "diverged" | "shape" (cannot be reconciled) | "ambiguous" (layout)
    shape: tuple[int, ...]
    engine_shape: tuple[int, ...]
    layout: str = ""  # steps taken to bring the engine tensor to our shape
    cosine: float | None = None
    nmse: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    nonfinite_ref: dict = field(default_factory=dict)
    nonfinite_engine: dict = field(default_factory=dict)
    masked: int = 0  # attention-mask fill elements left out of the metrics
    reasons: list[str] = field(default_factory=list)
    limit_nmse: float | None = None  # the limits this op was held to
    limit_cosine: float | None = None
    noise_nmse: float | None = None  # our own low-precision run's error here (with a noise floor)
    noise_cosine: float | None = None
    # local error: the engine's output against our op applied to the engine's own inputs
    # (None when some input has no engine tensor); small = the op is right, error came from upstream
    local_cosine: float | None = None
    local_nmse: float | None = None
    local_max_abs: float | None = None
    local_diverged: bool | None = None
    # the rounding budget (workbench/diff/budget.py): the op's precision, the local error and
    # the honest recompute's as powers (MSE / mean(exact^2)), their ratio, the rule that
    # decided local_diverged ("budget" or "fixed"), the ops recomputed for undumped inputs
    precision: str | None = None
    local_power: float | None = None
    budget_power: float | None = None
    limit_power: float | None = None  # the local error power this op may reach (FACTOR x its floored budget)
    ratio: float | None = None
    local_rule: str | None = None
    recomputed: list = field(default_factory=list)
    # RMS error per token position / RMS of the reference (None when the op has no token axis);
    # NaN at a position holding a non-finite element
    position_error: np.ndarray | None = None  # float32 [T]
    # where the non-finite elements are (either side; metrics.nonfinite_where), None when all are finite
    nonfinite: dict | None = None
    # cosine / nmse / max_abs / max_rel over the elements finite in both, when some are not
    # (the headline metrics are then NaN: null in JSON, "nan" in text)
    finite: dict | None = None

    @property
    def compared(self) -> bool:
        return self.status in ("ok", "diverged")

    @property
    def is_divergence(self) -> bool:
        return self.status in ("diverged", "shape")

    @property
    def position_reading(self) -> str | None:
        """A one-line reading of ``position_error`` when it has a clear shape (see
        :func:`workbench.diff.metrics.position_pattern`), else None."""
        return None if self.position_error is None else position_pattern(self.position_error)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "engine_name": self.engine_name, "index": self.index, "layer": self.layer,
            "status": self.status, "cosine": _num(self.cosine), "nmse": _num(self.nmse),
            "max_abs": _num(self.max_abs), "max_rel": _num(self.max_rel),
            "nonfinite_ref": self.nonfinite_ref, "nonfinite_engine": self.nonfinite_engine, "masked": self.masked,
            "nonfinite": self.nonfinite,
            "finite": None if self.finite is None else {k: (_num(v) if isinstance(v, float) else v)
                                                         for k, v in self.finite.items()},
            "shape": list(self.shape), "engine_shape": list(self.engine_shape),
            "layout": self.layout, "reasons": list(self.reasons),
            "limit_nmse": _num(self.limit_nmse), "limit_cosine": _num(self.limit_cosine),
            "noise_nmse": _num(self.noise_nmse), "noise_cosine": _num(self.noise_cosine),
            "local_cosine": _num(self.local_cosine), "local_nmse": _num(self.local_nmse),
            "local_max_abs": _num(self.local_max_abs), "local_diverged": self.local_diverged,
            "precision": self.precision, "local_power": _num(self.local_power),
            "local_sqnr_db": _num(sqnr_db(self.local_power)), "budget_power": _num(self.budget_power),
            "budget_sqnr_db": _num(sqnr_db(self.budget_power)), "limit_power": _num(self.limit_power),
            "ratio": _num(self.ratio),
            "local_rule": self.local_rule, "recomputed": list(self.recomputed),
            # per-position errors: always for ops off tolerance, for the others up to 512 tokens
            "position_error": (None if self.position_error is None
                               or (self.status == "ok" and len(self.position_error) > 512)
                               else [_num(float(x)) for x in self.position_error]),
        }


@dataclass
class DiffReport:
    """Every matched op in our execution order, the first divergence, and what did not match."""

    ops: list[OpDiff]
    order: list[str]
    unmatched_engine: list[str]
    unmatched_reference: list[str]
    tolerance: Tolerance
    renamed: dict[str, str] = field(default_factory=dict)  # engine name -> our name, where rules changed it
    suggestions: dict[str, str] = field(default_factory=dict)  # unmatched engine name -> closest op name
    inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # op -> the ops it reads (from the program)
    noise_dtype: str | None = None  # the dtype of the noise-floor run, if the limits were calibrated
    weights: list = field(default_factory=list)  # WeightDiff: engine tensors named like checkpoint tensors
    engine_total: int | None = None  # every tensor of the engine's dump (activations and weights)
    dropped: list[str] = field(default_factory=list)  # engine tensors the rules map to "" (left out on purpose)
    #: engine tensors that matched no op but hold NaN / +Inf: name -> [those, elements] (a finding)
    unmatched_nonfinite: dict = field(default_factory=dict)
    #: what each side's float32 matmuls ran as ("float32", "tf32", "n/a (cpu)", ...; None: not recorded)
    precision: dict = field(default_factory=dict)  # {"reference": ..., "engine": ...}
    precision_warning: str | None = None  # one line when one side ran TF32 and the other did not
    #: the head's rows (``lm_head``, ``logits``) where their positions were lined up (api.align_logits):
    #: {"compared", "positions", "reference", "engine", "T", "ops"}; None where no head tensor was matched
    logits: dict | None = None
    #: the engine adapter applied (workbench/diff/engines: "transformers", "llama.cpp"), None for none
    engine: str | None = None
    #: the engine's dump is one decode step (the last token, through its KV cache), compared with
    #: our full forward's row at that position
    decode: bool = False
    #: how the decode step was known when neither the caller nor the dump said (its shapes)
    decode_note: str | None = None
    #: what the diff chose that could hide a bug (a name of several nodes matched to another
    #: than the one written last): said in the summary and --json, never silently
    cautions: list = field(default_factory=list)
    #: the first finding's pattern ({"op", "pattern", "text"}: workbench/diff/signature.py), or None
    pattern: dict | None = None
    #: engine tensors an adapter left out on purpose -> why (no op of ours, the same as another)
    dropped_why: dict = field(default_factory=dict)
    #: the engine's precision and how it was known (workbench.diff.budget.EnginePrecision), None
    #: where the local errors are held to the fixed limits
    engine_precision: Any = None
    #: the engine's names matched by value (workbench.diff.automap.Proposal): ``--map auto``, or
    #: taken because few of its names were ours; None where the names were given or matched
    automap: Any = None

    @property
    def logits_partial(self) -> str | None:
        """The head's tensors compared at fewer than every position, in words ("logits at
        position 8 (the last) of 9 only; ..."), else None."""
        lg = self.logits
        if not lg or lg.get("positions") == "all":
            return None
        engine = lg.get("engine") or {}
        if len(set(engine.values())) == 1:
            eng = f"the engine {next(iter(engine.values()))}"
        else:
            eng = ", ".join(f"the engine's {k!r} {v}" for k, v in engine.items())
        return (f"{', '.join(lg['ops'])} compared at {lg['compared']} only (the reference holds "
                f"{lg['reference']}" + (f", {eng}" if eng else "") + ")")

    @property
    def first_divergence(self) -> OpDiff | None:
        return next((o for o in self.ops if o.is_divergence), None)

    @property
    def compared(self) -> int:
        return sum(o.compared for o in self.ops)

    @property
    def coverage(self) -> dict[str, Any]:
        """How much of the engine's dump was compared: ``compared`` of ``engine_tensors`` (the
        dump's tensors less those the rules drop), as ops and weights, and ``ops_compared`` of
        our program's ``ops``; ``enough`` when at least :data:`MIN_COVERAGE` of them were."""
        total = self.engine_total if self.engine_total is not None else \
            len(self.ops) + len(self.unmatched_engine) + len(self.weights)
        counted = max(total - len(self.dropped), 0)
        weights = sum(w.status in ("ok", "diverged") for w in self.weights)
        compared = self.compared + weights
        frac = compared / counted if counted else 0.0
        return {"compared": compared, "engine_tensors": counted, "dropped": len(self.dropped),
                "ops_compared": self.compared, "weights_compared": weights, "ops": len(self.order),
                "fraction": frac, "min_fraction": MIN_COVERAGE, "enough": compared > 0 and frac >= MIN_COVERAGE}

    def coverage_text(self) -> str:
        c = self.coverage
        parts = [f"{c['ops_compared']} op{'s' if c['ops_compared'] != 1 else ''}"]
        if c["weights_compared"]:
            parts.append(f"{c['weights_compared']} weight{'s' if c['weights_compared'] != 1 else ''}")
        dropped = f", {c['dropped']} more dropped by the rules" if c["dropped"] else ""
        partial = self.logits_partial
        return (f"compared {c['compared']} of the engine's {c['engine_tensors']} tensors ({', '.join(parts)}"
                f"{dropped}); {c['ops_compared']} of our {c['ops']} ops" + (f"; {partial}" if partial else ""))

    @property
    def low_coverage(self) -> str | None:
        """Why the diff cannot vouch for the engine (too little of its dump compared), or None."""
        c = self.coverage
        if c["enough"]:
            return None
        return (f"coverage too low for a verdict: compared {c['compared']} of the engine's {c['engine_tensors']} "
                f"tensors ({c['fraction']:.0%}; a verdict needs {MIN_COVERAGE:.0%}), {c['ops_compared']} of our "
                f"{c['ops']} ops: map the engine's names (--map RULES.json) or drop those with no counterpart "
                "(a rule replacing them with \"\")")

    @property
    def clean(self) -> bool:
        """Nothing found and enough of the dump compared to say so (CLI exit status 0)."""
        return not self.found and self.low_coverage is None

    @property
    def outcome(self) -> str:
        """"divergence" (a finding: exit 1), "low-coverage" (nothing found in too little: exit 1)
        or "no-divergence" (exit 0)."""
        return "divergence" if self.found else ("low-coverage" if self.low_coverage else "no-divergence")

    @property
    def found(self) -> bool:
        """A divergence, an op wrong on the engine's own inputs, or a weight unlike the checkpoint's
        (CLI exit status 1)."""
        return (self.first_divergence is not None or self.first_local_divergence is not None
                or self.first_weight_mismatch is not None or bool(self.unmatched_nonfinite))

    @property
    def first_weight_mismatch(self):
        """The first engine weight (checkpoint order) that differs from the checkpoint's, or None."""
        return next((w for w in self.weights if w.is_mismatch), None)

    @property
    def first_local_divergence(self) -> OpDiff | None:
        """The first op that, fed the engine's own inputs, does not reproduce the engine's output."""
        return next((o for o in self.ops if o.local_diverged), None)

    def __getitem__(self, op: str) -> OpDiff:
        for o in self.ops:
            if o.op == op:
                return o
        raise KeyError(f"op {op!r} was not compared")

    def first_divergence_dict(self) -> dict[str, Any] | None:
        fd = self.first_divergence
        if fd is None:
            return None
        d = {"op": fd.op, "cosine": _num(fd.cosine), "nmse": _num(fd.nmse), "max_abs": _num(fd.max_abs),
             "engine_name": fd.engine_name, "index": fd.index, "layer": fd.layer, "status": fd.status,
             "reasons": list(fd.reasons)}
        if fd.op in self.inputs:
            by = {o.op: o.status for o in self.ops}
            d["inputs"] = [{"op": s, "status": by.get(s, "not compared")} for s in self.inputs[fd.op]]
        if fd.position_error is not None:
            d["positions"] = {"error": [_num(float(x)) for x in fd.position_error],
                              "pattern": fd.position_reading,
                              "nonfinite": None if fd.nonfinite is None else fd.nonfinite["per_row"]}
        if fd.nonfinite is not None:
            d["nonfinite"] = fd.nonfinite
            d["finite"] = {k: (_num(v) if isinstance(v, float) else v) for k, v in (fd.finite or {}).items()}
        if fd.local_nmse is not None:
            d["local"] = {"cosine": _num(fd.local_cosine), "nmse": _num(fd.local_nmse),
                          "max_abs": _num(fd.local_max_abs), "diverged": fd.local_diverged}
        return d

    def verdict(self) -> str | None:
        """One sentence on where the bug is, from the global and local errors (and the weights);
        with nothing found in too little of the dump, why there is no verdict."""
        v = self._verdict()
        if v is None and self.first_weight_mismatch is None:
            return self.nonfinite_unmatched_text() or self.low_coverage
        fw = self.first_weight_mismatch
        if fw is not None:
            w = f"the engine's {fw.name} differs from the checkpoint's ({fw.reasons[0] if fw.reasons else fw.status})"
            return w if v is None else f"{w}. {v}"
        return v

    def nonfinite_unmatched_text(self) -> str | None:
        """One sentence on the engine tensors that matched no op and hold NaN / Inf, or None."""
        if not self.unmatched_nonfinite:
            return None
        (name, (bad, size)), more = next(iter(self.unmatched_nonfinite.items())), len(self.unmatched_nonfinite) - 1
        return (f"the engine's {name} holds {bad} NaN / +Inf values (of {size}) and matched no op of ours"
                + (f" (and {more} more such tensors)" if more else "")
                + ": its NaN / Inf is not compared; give it our op's name (--map) to see where it starts")

    def _verdict(self) -> str | None:
        fd = self.first_divergence
        if fd is None:
            fl = self.first_local_divergence
            if fl is None:
                return None
            if fl.local_rule == "growth":
                return f"no op is beyond tolerance, but at {fl.op} {_local(fl)}; look at this op"
            return (f"no op is beyond tolerance, but {fl.op} is computed differently: fed the engine's own "
                    f"inputs, our op does not reproduce the engine's output ({_local(fl)}, "
                    f"cosine {fl.local_cosine:.6g}); look at this op")
        if fd.status == "shape":
            n_shape = sum(o.status == "shape" for o in self.ops)
            hint = (f"; {n_shape} of {len(self.ops)} matched ops differ in shape: did the engine run the same "
                    f"tokens ({fd.shape[-2] if len(fd.shape) >= 2 else '?'} of them here)?"
                    if n_shape > len(self.ops) // 2 else "")
            return f"{fd.op}: the engine's tensor has another shape ({fd.reasons[0]}){hint}"
        fl = self.first_local_divergence
        if fd.local_diverged:
            head = (f"{fd.op} is computed differently: fed the engine's own inputs, our op does not reproduce "
                    f"the engine's output ({_local(fd)}); look at this op")
            if fl is not None and fl.index < fd.index:
                return head + f"; before it, {fl.op} is wrong on its own inputs too ({_local(fl)})"
            return head
        drift = ("error accumulates (precision), or sits in an op whose inputs were not dumped"
                 + ("" if self.noise_dtype else " (an engine computing in bfloat16/float16: try --noise-floor)"))
        if fd.local_diverged is False:
            head = f"{fd.op} is right on the engine's inputs ({_local(fd)}): the error came in upstream"
            if fl is None:
                return head + "; no single op is wrong on its own: " + drift
            if fl.index < fd.index:
                return head + f"; the op that is itself wrong is {fl.op} ({_local(fl)}); look at it"
            return head + f"; {drift}; later, {fl.op} is itself wrong ({_local(fl)})"
        if fl is not None:  # the first divergence's own inputs were not all dumped
            where = "before" if fl.index < fd.index else "after"
            return (f"the first op found wrong on the engine's own inputs is {fl.op} ({where} the first divergence; "
                    f"{_local(fl)}); {fd.op}'s inputs were not all dumped")
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_divergence": self.first_divergence_dict(),
            "outcome": self.outcome,
            "compared": self.compared,
            "coverage": self.coverage,
            "unmatched_engine": list(self.unmatched_engine),
            "unmatched_nonfinite": {k: list(v) for k, v in self.unmatched_nonfinite.items()},
            "unmatched_reference": list(self.unmatched_reference),
            "ops": [o.to_dict() for o in self.ops],
            "tolerance": self.tolerance.to_dict(),
            "noise_dtype": self.noise_dtype,
            "first_local_divergence": (None if self.first_local_divergence is None else
                                       self.first_local_divergence.op),
            "weights": [w.to_dict() for w in self.weights],
            "first_weight_mismatch": (None if self.first_weight_mismatch is None else
                                      self.first_weight_mismatch.name),
            "verdict": self.verdict(),
            "renamed": dict(self.renamed),
            "suggestions": dict(self.suggestions),
            "dropped": list(self.dropped),
            "matmul_precision": dict(self.precision),
            "precision_warning": self.precision_warning,
            "logits": self.logits,
            "engine": self.engine,
            "decode": self.decode,
            "decode_note": self.decode_note,
            "cautions": list(self.cautions),
            "pattern": self.pattern,
            "dropped_why": dict(self.dropped_why),
            "engine_precision": None if self.engine_precision is None else self.engine_precision.to_dict(),
            "automap": None if self.automap is None else self.automap.to_dict(),
        }

    def summary(self, max_ops: int = 40) -> str:
        """Text report: the finding, a table of ops (around the first divergence when long), unmatched
        names (workbench/diff/report_text.py)."""
        return summary_text(self, max_ops)

    __str__ = summary

    def _repr_pretty_(self, p, cycle):  # IPython
        p.text(self.summary())
