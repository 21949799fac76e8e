"""Where an op's error sits: per token position, and the shape of its non-finite elements.

:func:`position_profile` is the RMS error per token position (over the elements finite in
both, attention-mask fill left out) and :func:`position_pattern` its one-line reading (the
error at one position alone, growing with the position, starting at a position);
:func:`nonfinite_where` views an op's non-finite elements as tokens x channels and names
their shape (see :func:`_classify`: a block, a staircase or tiles point to memory and to
``workbench hazards``), :func:`describe_nonfinite` says it in one line.  The per-op metrics
and the tolerance are in workbench/diff/metrics.py (which re-exports these names).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from workbench.dtypes import FP16_LOWEST


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
