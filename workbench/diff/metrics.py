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
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

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


def token_axis(shape: tuple, tokens: int) -> int | None:
    """The token axis of one of our activations: the last non-final axis of size ``tokens``
    (``[1, T, D]`` -> 1, heads-first ``[1, H, T, D]`` and scores ``[1, H, T, S]`` -> 2)."""
    for ax in range(len(shape) - 2, -1, -1):
        if shape[ax] == tokens:
            return ax
    return None


def _bad_mask(ref: np.ndarray, eng: np.ndarray, mask_below: float | None) -> np.ndarray:
    """Elements non-finite on either side, attention-mask fill (both <= mask_below) left out."""
    bad = ~(np.isfinite(ref) & np.isfinite(eng))
    if mask_below is not None and bad.any():
        bad &= ~((ref <= mask_below) & (eng <= mask_below))
    return bad


def position_profile(ref: np.ndarray, eng: np.ndarray, tokens: int, mask_below: float | None = FP16_LOWEST):
    """Per token position: RMS error over that position's elements / RMS of the whole reference.

    None when no axis has ``tokens`` entries.  Masked (attention fill) elements are left
    out; a position holding a non-finite element (either side) is NaN, never a number
    computed from the rest; a position with nothing left is NaN too.
    """
    ax = token_axis(tuple(ref.shape), tokens)
    if ax is None:
        return None
    r = np.moveaxis(np.asarray(ref, np.float32), ax, 0).reshape(tokens, -1)
    e = np.moveaxis(np.asarray(eng, np.float32), ax, 0).reshape(tokens, -1)
    bad = _bad_mask(r, e, mask_below)
    ok = np.isfinite(r) & np.isfinite(e)
    if mask_below is not None:
        ok &= ~((r <= mask_below) & (e <= mask_below))
    r64, e64 = np.where(ok, r, 0).astype(np.float64), np.where(ok, e, 0).astype(np.float64)
    d2 = (e64 - r64) ** 2
    r2 = r64 * r64
    n = ok.sum(axis=1)
    rms_ref = np.sqrt(r2.sum() / max(int(n.sum()), 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        prof = np.sqrt(d2.sum(axis=1) / n) / (rms_ref if rms_ref > 0 else 1.0)
    prof[bad.any(axis=1)] = np.nan
    return prof.astype(np.float64)


#: at most this many runs of tokens / channels are listed (the counts are always complete)
MAX_RUNS = 16


def _runs(idx: np.ndarray) -> list[list[int]]:
    """Sorted indices -> inclusive [first, last] runs of consecutive ones."""
    if idx.size == 0:
        return []
    cut = np.nonzero(np.diff(idx) != 1)[0]
    starts = np.concatenate(([idx[0]], idx[cut + 1]))
    ends = np.concatenate((idx[cut], [idx[-1]]))
    return [[int(a), int(b)] for a, b in zip(starts, ends)]


#: patterns of non-finite elements that point to memory (a buffer read before it was written,
#: or overwritten while still read): the diff then points to ``workbench hazards``
MEMORY_PATTERNS = ("block", "staircase", "tiles")
_MAX_RECTS = 4096  # beyond this many rectangles a pattern is "irregular" (bounded work)


def _rectangles(bad: np.ndarray, limit: int) -> list[tuple[int, int, int, int]] | None:
    """``bad`` (rows x channels) as maximal rectangles ``(row0, row1, ch0, ch1)`` (inclusive):
    runs of consecutive rows with the same pattern x that pattern's channel runs.  None
    past ``limit`` rectangles."""
    rows = np.nonzero(bad.any(axis=1))[0]
    if rows.size == 0:
        return []
    change = np.ones(rows.size, bool)  # a row starts a group unless it follows an identical row
    change[1:] = (np.diff(rows) != 1) | (bad[rows[1:]] != bad[rows[:-1]]).any(axis=1)
    starts = np.nonzero(change)[0]
    ends = np.concatenate((starts[1:], [rows.size])) - 1
    rects: list[tuple[int, int, int, int]] = []
    for a, b in zip(starts, ends):
        for c0, c1 in _runs(np.nonzero(bad[rows[a]])[0]):
            rects.append((int(rows[a]), int(rows[b]), c0, c1))
            if len(rects) > limit:
                return None
    return rects


def _pow2_step(values) -> int:
    """The largest power of two dividing every value (0 divides by anything)."""
    g = 0
    for v in values:
        g = math.gcd(g, int(v))
    return g & -g if g else 1 << 30


def _staircase(bad: np.ndarray, valid: np.ndarray) -> str | None:
    """``bad`` / ``valid`` as [slabs, tokens, channels] (slabs: e.g. heads).  A staircase: in
    every row the bad elements are the first (or last) n of its valid ones, and n never
    decreases (or never increases) from token to token within each slab, taking at least
    two non-zero values.  Returns the phrase for it, or None."""
    if bad.ndim != 3 or bad.shape[1] < 2:
        return None
    n = bad.sum(axis=-1)  # [slabs, tokens]
    if len(np.unique(n[n > 0])) < 2:  # (cheap checks first)
        return None
    steps = np.diff(n, axis=1)
    way = "grows" if (steps >= 0).all() else "shrinks" if (steps <= 0).all() else None
    if way is None:
        return None
    for lead, flip in (("leading", False), ("trailing", True)):
        b, v = (bad[..., ::-1], valid[..., ::-1]) if flip else (bad, valid)
        if np.array_equal(b, v & (np.cumsum(v, axis=-1, dtype=np.int32) <= n[..., None])):
            return (f"per token a run of {lead} channels that {way} from token to token "
                    "(an input overwritten while the kernel still reads it)")
    return None


def _classify(grid: np.ndarray, valid: np.ndarray, stair: np.ndarray | None,
              stair_valid: np.ndarray | None) -> tuple[str, str]:
    """Name the shape of the non-finite elements of one op, and say what it points to.

    ``grid`` / ``valid``: bad / not-mask-fill as rows (tokens) x channels; ``stair`` /
    ``stair_valid``: the same as [slabs, tokens, last axis] (None without a second axis).

    * ``everywhere``: every element (mask fill aside): no clue in the shape; the op's weights,
      constants or inputs first (not the hazards pointer);
    * ``columns``: the same channels at every token: a per-channel cause (a weight row, a scale);
    * ``scattered``: most bad elements have no bad neighbour in their row: overflow;
    * ``staircase``: per token a growing (or shrinking) run of leading (or trailing) channels;
    * ``block``: at most 4 rectangles of rows x channel runs;
    * ``tiles``: rectangles aligned to a power-of-two grid (at least 2 rows x 4 channels);
    * ``irregular``: none of these.

    block, staircase and tiles are what memory leaves (:data:`MEMORY_PATTERNS`).
    """
    count = int(np.count_nonzero(grid))
    if count == int(np.count_nonzero(valid)):
        return "everywhere", ("every element, a shape that carries no clue: check this op's weights and constants "
                              "(`workbench inspect --values`, and the engine's copy of them) and its inputs first "
                              "(a buffer never written before the read looks the same)")
    cols = grid.any(axis=0)
    if grid.shape[0] >= 2 and np.array_equal(grid, valid & cols[None, :]):
        return "columns", ("the same channels at every token: a per-channel cause, such as a weight row, scale "
                           "or bias of this op (`workbench inspect --values`, and the engine's copy of the weights)")
    side = np.zeros_like(grid)
    pair = grid[:, 1:] & grid[:, :-1]
    side[:, 1:] |= pair
    side[:, :-1] |= pair
    if int(np.count_nonzero(side)) * 2 < count:
        return "scattered", ("isolated elements, no two side by side: overflow of large values (the inputs' "
                             "magnitudes, the compute dtype's range), not a memory pattern")
    hazards = ": check the engine's dispatch schedule with `workbench hazards SCHEDULE.json`"
    if stair is not None:
        phrase = _staircase(stair, stair_valid)
        if phrase:
            return "staircase", phrase + hazards
    rects = _rectangles(grid, _MAX_RECTS)
    if rects is not None and len(rects) <= 4:
        return "block", (f"{len(rects)} contiguous token x channel block(s), what a buffer read before it was "
                         "written (or overwritten while read) leaves" + hazards)
    if rects is not None:
        tw = _pow2_step(v for r0, r1, c0, c1 in rects for v in (c0, c1 + 1))
        th = _pow2_step(v for r0, r1, c0, c1 in rects for v in (r0, r1 + 1))
        if tw >= 4 and th >= 2:
            return "tiles", (f"{len(rects)} rectangles on a grid of {min(th, grid.shape[0])} x "
                             f"{min(tw, grid.shape[1])} tiles, what a tiled kernel writing over memory still "
                             "read leaves" + hazards)
    return "irregular", "no simple shape"


def nonfinite_where(ref: np.ndarray, eng: np.ndarray, tokens: int | None = None,
                    mask_below: float | None = FP16_LOWEST) -> dict[str, Any] | None:
    """Where the non-finite elements (either side, mask fill left out) of one op are.

    The op is viewed as rows x channels: rows are token positions when an axis has
    ``tokens`` entries (``axis: "token"``; channels are the other axes flattened, e.g.
    ``h * D + d`` for heads-first ``[1, H, T, D]``), otherwise the leading axes
    flattened (``axis: "row"``) with the last axis as channels.  Returns None when every
    element is finite, else ``{count, engine, reference, axis, rows, channels, n_rows,
    n_channels, per_row, pattern, pattern_text, tile}``: ``rows`` / ``channels`` are
    inclusive ``[first, last]`` runs (at most :data:`MAX_RUNS` listed), ``per_row`` the
    count per row (token axis only), ``pattern`` the shape's name (see :func:`_classify`:
    everywhere, columns, scattered, staircase, block, tiles, irregular), ``pattern_text``
    what it points to, ``tile`` whether the pattern is one memory leaves (block,
    staircase, tiles: check ``workbench hazards``).
    """
    r = np.asarray(ref, np.float32)
    e = np.asarray(eng, np.float32)
    bad = _bad_mask(r, e, mask_below)
    count = int(np.count_nonzero(bad))
    if count == 0:
        return None
    valid = np.ones(bad.shape, bool)
    if mask_below is not None:
        valid &= ~((r <= mask_below) & (e <= mask_below))
    ax = token_axis(tuple(r.shape), tokens) if tokens else None
    if ax is not None:
        grid = np.moveaxis(bad, ax, 0).reshape(tokens, -1)
        vgrid = np.moveaxis(valid, ax, 0).reshape(tokens, -1)
    elif r.ndim >= 1 and r.size:
        grid, vgrid = bad.reshape(-1, r.shape[-1]), valid.reshape(-1, r.shape[-1])
    else:
        grid, vgrid = bad.reshape(1, -1), valid.reshape(1, -1)
    stair = stair_valid = None
    sax = ax if ax is not None else (r.ndim - 2 if r.ndim >= 2 else None)
    if sax is not None:
        t = r.shape[sax]
        stair = np.moveaxis(bad, sax, -2).reshape(-1, t, r.shape[-1])
        stair_valid = np.moveaxis(valid, sax, -2).reshape(-1, t, r.shape[-1])
    pattern, text = _classify(grid, vgrid, stair, stair_valid)
    rows = _runs(np.nonzero(grid.any(axis=1))[0])
    chans = _runs(np.nonzero(grid.any(axis=0))[0])
    return {
        "count": count,
        "engine": int(np.count_nonzero(bad & ~np.isfinite(e))),
        "reference": int(np.count_nonzero(bad & ~np.isfinite(r))),
        "axis": "token" if ax is not None else "row",
        "rows": rows[:MAX_RUNS], "channels": chans[:MAX_RUNS],
        "n_rows": int(grid.any(axis=1).sum()), "n_channels": int(grid.any(axis=0).sum()),
        "rows_total": int(grid.shape[0]), "channels_total": int(grid.shape[1]),
        "per_row": grid.sum(axis=1).astype(int).tolist() if ax is not None else None,
        "pattern": pattern, "pattern_text": text, "tile": pattern in MEMORY_PATTERNS,
    }


def describe_nonfinite(w: dict[str, Any]) -> str:
    """One line: how many non-finite elements, on which side, at which tokens x channels, in
    which pattern, and what that points to (``workbench hazards`` for the patterns memory leaves)."""
    def runs(rs, n, total):
        txt = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in rs)
        return txt + (", ..." if n > sum(b - a + 1 for a, b in rs) else "") + f" ({n} of {total})"

    sides = [f"{w[s]} in the {s}" for s in ("engine", "reference") if w[s]]
    rows = "tokens" if w["axis"] == "token" else "rows"
    line = (f"{w['count']} non-finite element(s) ({', '.join(sides)}) at {rows} "
            f"{runs(w['rows'], w['n_rows'], w['rows_total'])} x channels "
            f"{runs(w['channels'], w['n_channels'], w['channels_total'])}")
    return line + f"; {w['pattern']}: {w['pattern_text']}"


def position_pattern(profile) -> str | None:
    """A one-line reading of a per-position error profile, when it has a clear shape."""
    p = np.asarray(profile, dtype=np.float64)
    if p.size < 3 or not np.isfinite(p).any():
        return None
    p = np.where(np.isfinite(p), p, 0.0)
    top = p.max()
    if top <= 0:
        return None
    big = p > 0.1 * top
    if big.sum() == 1:
        return f"the error sits at position {int(np.argmax(p))} alone"
    onset = int(np.argmax(p > 0.01 * top))
    post = p[onset:]
    if post.size >= 3:
        rho = np.corrcoef(np.argsort(np.argsort(post)), np.arange(post.size))[0, 1]
        if rho > 0.9 and post[-1] > 2 * post[0]:
            return "the error grows with the position (RoPE: frequencies, base, rotated dims, position offset?)"
    first = int(np.argmax(big))
    if first > 0 and big[first:].all() and p[:first].max() < 0.01 * top:
        return (f"positions 0..{first - 1} match; the error starts at position {first} and stays "
                "(a window, mask, cache offset or position-dependent bug?)")
    return None
