"""Error metrics between a reference activation and an engine's, and the tolerance.

All metrics are computed from float32 inputs with float64 sums (so values near
float32's largest, such as mask fill, never overflow them; ``1 - cosine``
from ``|engine - ref|^2`` so it stays accurate near 1), on the elements finite in both
tensors; non-finite elements are counted separately (NaN, +Inf, -Inf, per element,
never through a sum):

* ``cosine``: cosine similarity of the flattened tensors (1.0 when both are all zeros,
  0.0 when exactly one is);
* ``nmse``: mean squared error divided by the variance of the reference; for a constant
  reference, by its mean square; 0 when both are exactly equal;
* ``max_abs``: the largest ``|engine - ref|``;
* ``max_rel``: the largest ``|engine - ref| / max(|ref|, floor)`` with
  ``floor = 1e-3 * rms(ref)``, so that reference elements near zero do not dominate.

Attention-mask fill is left out: elements at or below ``Tolerance.mask_below`` (default
-65504, float16's lowest) in *both* tensors are masked positions, whatever value each
side fills them with (-inf, the dtype's lowest, -1e9), and are only counted (``masked``).

An op has *diverged* when its cosine is below ``Tolerance.min_cosine`` (default 0.995),
or its NMSE above ``Tolerance.max_nmse`` (default 1e-2), or (when set) its max abs error
above ``Tolerance.max_abs``, or when the engine has non-finite elements where the
reference is finite.  The defaults pass an engine computing in bfloat16/float16 against
our float32 reference on a whole forward pass of a small model, and flag the usual
porting bugs (a wrong RoPE, a missing norm scale, transposed weights, a dropped
residual) at the op where they happen.  Tighten them to diff float32 engines.

*Local error*: when the engine dumped an op's inputs too, we also apply our op to the
engine's own inputs and compare the engine's output with that.  It measures the op alone,
without the drift accumulated upstream, and is held to ``local_min_cosine`` (0.9995) and
``local_max_nmse`` (1e-3): one op's bfloat16 rounding is ~1e-5.  The first op whose local
error is beyond those is where the bug *is*; the first divergence is where it *shows*.

A *noise floor* replaces the fixed limits by per-op ones: we run our reference a second
time in the engine's compute dtype (bfloat16, float16) and measure, per op, how far an
honest low-precision implementation lands from our float32 values.  An op then diverges
when its nmse or 1-cosine exceeds ``noise_factor`` (default 10) times that (and at least
``noise_min``): strict in early layers where rounding has not accumulated yet, looser in
late ones where it has.

Where an op's error sits (per token position; the shape of its non-finite elements) is
workbench/diff/where.py; its names stay importable from here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from workbench.diff.where import (MAX_RUNS, MEMORY_PATTERNS, describe_nonfinite,  # noqa: F401  (re-exported)
                                  nonfinite_where, position_pattern, position_profile, token_axis)
from workbench.dtypes import FP16_LOWEST


@dataclass(frozen=True)
class Tolerance:
    min_cosine: float = 0.995
    max_nmse: float = 1e-2
    max_abs: float | None = None
    #: elements at or below this in both tensors are attention-mask fill (-inf, the dtype's
    #: lowest, -1e9: engines differ) and are left out of every metric; None: keep them
    mask_below: float | None = FP16_LOWEST
    #: with a noise floor (our own run in the engine's dtype), an op diverges when its nmse
    #: or 1-cosine exceeds noise_factor x the floor's (and noise_min), instead of the fixed limits
    noise_factor: float = 10.0
    noise_min: float = 1e-6
    #: local error (our op on the engine's own inputs vs the engine's output): one op's
    #: rounding only, no accumulated drift, so the limits are tighter
    local_min_cosine: float = 0.9995
    local_max_nmse: float = 1e-3
    #: an RMS error below rel_floor x RMS(ref) (two bfloat16 steps) is never a divergence by
    #: nmse: rounding of small variations riding on a large mean (router weights near 0.5)
    rel_floor: float = 2.0 ** -7

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if v is None and name in ("max_abs", "mask_below"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(v)):
                raise ValueError(f"tolerance {name} must be a finite number, not {v!r}")
            object.__setattr__(self, name, float(v))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_any(cls, tol: "Tolerance | dict | None") -> "Tolerance":
        if tol is None:
            return cls()
        if isinstance(tol, Tolerance):
            return tol
        if isinstance(tol, dict):
            known = {f for f in cls.__dataclass_fields__}
            unknown = set(tol) - known
            if unknown:
                raise ValueError(f"unknown tolerance key(s) {sorted(unknown)}; use {', '.join(sorted(known))}")
            return cls(**tol)
        raise TypeError(f"tolerance must be a Tolerance or a dict, not {type(tol).__name__}")


def _nonfinite_fast(a: np.ndarray, finite: np.ndarray, all_finite: bool) -> dict[str, int]:
    if all_finite:
        return {"nan": 0, "posinf": 0, "neginf": 0}
    bad = a[~finite]
    return {"nan": int(np.isnan(bad).sum()), "posinf": int(np.isposinf(bad).sum()),
            "neginf": int(np.isneginf(bad).sum())}


def error_metrics(ref: np.ndarray, eng: np.ndarray, mask_below: float | None = FP16_LOWEST) -> dict[str, Any]:
    """Metrics between two same-shaped arrays (see module docstring).

    When any element (outside the mask fill) is non-finite on either side, ``cosine``,
    ``nmse``, ``max_abs`` and ``max_rel`` are NaN (never a clean-looking number beside a
    NaN) and ``finite`` holds the same metrics over the elements finite in both.
    """
    if ref.shape != eng.shape:
        raise ValueError(f"shapes differ: {ref.shape} vs {eng.shape}")
    r = np.asarray(ref, dtype=np.float32).ravel()
    e = np.asarray(eng, dtype=np.float32).ravel()
    masked = 0
    if mask_below is not None:
        mk = np.minimum(r, e) <= mask_below  # NaN compares false: never masked
        mk &= np.maximum(r, e) <= mask_below
        masked = int(np.count_nonzero(mk))
        if masked:
            keep = ~mk
            r, e = r[keep], e[keep]
    fin_r, fin_e = np.isfinite(r), np.isfinite(e)
    all_r, all_e = bool(fin_r.all()), bool(fin_e.all())
    nf_r, nf_e = _nonfinite_fast(r, fin_r, all_r), _nonfinite_fast(e, fin_e, all_e)
    new_nonfinite = 0 if all_e else int(np.count_nonzero(fin_r & ~fin_e))
    ref_only = 0 if all_r else int(np.count_nonzero(~fin_r & fin_e))
    both_bad = 0 if (all_r or all_e) else int(np.count_nonzero(~fin_r & ~fin_e))
    if not (all_r and all_e):
        both = fin_r & fin_e
        r, e = r[both], e[both]
    fin = _finite_metrics(r, e)
    nonfinite = new_nonfinite + ref_only + both_bad
    out = {
        "cosine": fin["cosine"], "nmse": fin["nmse"], "max_abs": fin["max_abs"], "max_rel": fin["max_rel"],
        "nmse_power": fin["nmse_power"],  # MSE / mean(ref^2)
        "nonfinite_ref": nf_r, "nonfinite_engine": nf_e,
        "nonfinite_new": new_nonfinite,  # finite in ours, non-finite in the engine
        "nonfinite_ref_only": ref_only,  # non-finite in ours, finite in the engine
        "nonfinite_both": both_bad,
        "nonfinite": nonfinite,  # elements non-finite on either side (mask fill left out)
        "finite": None,  # the metrics over the elements finite in both, when some are not
        "elements": int(ref.size), "masked": masked,
    }
    if nonfinite:
        out["finite"] = dict(fin, elements=int(r.size))
        for k in ("cosine", "nmse", "max_abs", "max_rel", "nmse_power"):
            out[k] = float("nan")
    return out


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Sum of a * b over two flat float32 arrays, accumulated in float64 (cannot overflow)."""
    return float(np.einsum("i,i->", a, b, dtype=np.float64))


def _finite_metrics(r: np.ndarray, e: np.ndarray) -> dict[str, float]:
    """cosine, nmse, max_abs, max_rel, nmse_power of two flat float32 arrays, all finite.

    Sums accumulate in float64: a float32 value squares to at most ~1.2e77, so no sum of
    finite inputs overflows (mask fill near float32's largest included), and every metric
    of finite inputs is a number (nmse, max_rel and nmse_power +inf against an all-zero
    reference).  ``e - r`` is taken in float32, halved first when it could overflow.
    """
    nan = float("nan")
    n = r.size
    if n == 0:
        return {"cosine": nan, "nmse": nan, "max_abs": nan, "max_rel": nan, "nmse_power": nan}
    amax = max(float(r.max()), -float(r.min()), float(e.max()), -float(e.min()))
    s = 1.0 if amax < 1.7e38 else 0.5  # halving is exact, and keeps e - r finite
    d = e - r if s == 1.0 else e * np.float32(s) - r * np.float32(s)
    srr, see, sre, sdd = _dot(r, r), _dot(e, e), _dot(r, e), _dot(d, d) / (s * s)
    nr, ne = math.sqrt(srr), math.sqrt(see)
    if srr == 0 and see == 0:
        cos = 1.0
    elif srr == 0 or see == 0:
        cos = 0.0
    else:
        cos = sre / (nr * ne)
        if cos > 0.99 and max(nr, ne) < 1e3 * min(nr, ne):  # near 1: 1 - cosine from |d|^2, exact
            cos = 1.0 - (sdd - (nr - ne) ** 2) / (2.0 * nr * ne)  # for equal tensors (cancels if nr >> ne)
        cos = float(np.clip(cos, -1.0, 1.0))
    mse = sdd / n
    mean_r = float(r.sum(dtype=np.float64)) / n
    var = srr / n - mean_r * mean_r
    if mean_r * mean_r > 0.5 * srr / n:  # a large mean: subtract it first (no cancellation)
        c = r * np.float32(s) - np.float32(mean_r * s)
        var = _dot(c, c) / (s * s) / n
    nmse_power = mse / (srr / n) if srr > 0 else (0.0 if mse == 0 else float("inf"))
    if mse == 0.0:
        nmse = 0.0
    else:
        denom = var if var > 1e-12 * (srr / n) else srr / n
        nmse = mse / denom if denom > 0 else float("inf")
    np.abs(d, out=d)
    max_abs = float(d.max()) / s
    floor = 1e-3 * math.sqrt(srr / n)
    if floor > 0:
        den = np.abs(r)
        if s != 1.0:
            den *= np.float32(s)
        np.maximum(den, max(np.float32(floor * s), np.finfo(np.float32).tiny), out=den)
        with np.errstate(over="ignore"):
            max_rel = float((d / den).max())
        if math.isinf(max_rel):  # beyond float32: again in float64
            max_rel = float((d.astype(np.float64) / den).max())
    else:
        max_rel = 0.0 if max_abs == 0 else float("inf")
    return {"cosine": cos, "nmse": nmse, "max_abs": max_abs, "max_rel": max_rel, "nmse_power": nmse_power}


def _finite_part(m: dict[str, Any]) -> dict[str, Any]:
    """The metrics over the elements finite in both (``m`` itself when all are)."""
    return m.get("finite") or m


def _above_floor(m: dict[str, Any], tol: Tolerance) -> bool:
    p = _finite_part(m).get("nmse_power", float("inf"))
    return bool(np.isnan(p) or p > tol.rel_floor ** 2)


def nonfinite_reasons(m: dict[str, Any], ours: str = "the reference") -> list[str]:
    """One reason per way the two sides disagree on finiteness (NaN on either side is a finding)."""
    why = []
    if m.get("nonfinite_new"):
        why.append(f"{m['nonfinite_new']} element(s) non-finite in the engine, finite in {ours}")
    if m.get("nonfinite_ref_only"):
        why.append(f"{m['nonfinite_ref_only']} element(s) non-finite in {ours}, finite in the engine")
    if m.get("nonfinite_both"):
        why.append(f"{m['nonfinite_both']} element(s) non-finite in both")
    return why


def local_diverged(m: dict[str, Any], tol: Tolerance) -> bool:
    """Our op on the engine's own inputs against the engine's output: beyond the local limits,
    or non-finite where the other side is finite (NaN in both, from NaN inputs, is not this op's doing)."""
    f = _finite_part(m)
    cos, nmse = f["cosine"], f["nmse"]
    return bool(m["nonfinite_new"] or m.get("nonfinite_ref_only")
                or (not np.isnan(cos) and cos < tol.local_min_cosine)
                or (not np.isnan(nmse) and nmse > tol.local_max_nmse and _above_floor(m, tol)))


def noise_limits(noise: dict[str, Any] | None, tol: Tolerance) -> tuple[float, float]:
    """(max nmse, min cosine) for one op: fixed, or scaled from its noise floor."""
    if noise is None:
        return tol.max_nmse, tol.min_cosine
    noise = _finite_part(noise)
    fn, fc = noise.get("nmse"), noise.get("cosine")
    fn = 0.0 if fn is None or np.isnan(fn) else fn
    fc = 1.0 if fc is None or np.isnan(fc) else fc
    max_nmse = max(tol.noise_factor * fn, tol.noise_min)
    min_cos = 1.0 - max(tol.noise_factor * (1.0 - fc), tol.noise_min)
    return max_nmse, min_cos


def diverged(m: dict[str, Any], tol: Tolerance, noise: dict[str, Any] | None = None,
             noise_dtype: str | None = None) -> list[str]:
    """Reasons the metrics are beyond tolerance (empty when within).

    Any non-finite element, on either side, is a reason; the other limits are then
    checked over the elements finite in both (and say so).  ``noise``: this op's metrics
    for our own run in the engine's dtype against our reference; the limits then scale
    with it (see :class:`Tolerance`).
    """
    why = nonfinite_reasons(m)
    f = _finite_part(m)
    over = "" if m.get("finite") is None else f" over the {m['finite']['elements']} element(s) finite in both"
    cos, nmse = f["cosine"], f["nmse"]
    max_nmse, min_cos = noise_limits(noise, tol)
    what = "" if noise is None else f" (= {tol.noise_factor:g} x our {noise_dtype or 'low-precision'} run's)"
    if not np.isnan(cos) and cos < min_cos:
        why.append(f"cosine {cos:.6g} < {min_cos:.6g}" + what + over)
    if not np.isnan(nmse) and nmse > max_nmse and _above_floor(m, tol):
        why.append(f"nmse {nmse:.3g} > {max_nmse:.3g}" + what + over)
    if tol.max_abs is not None and not np.isnan(f["max_abs"]) and f["max_abs"] > tol.max_abs:
        why.append(f"max_abs {f['max_abs']:.3g} > {tol.max_abs:g}" + over)
    return why
