"""The head's rows (``lm_head``, ``logits``): which token positions each side holds and lining them up.

Split out of api.py (issue 34); api re-exports every name.
"""
from __future__ import annotations

import json
from typing import Mapping, Sequence

import numpy as np

from workbench.diff import readers
from workbench.diff.report import DiffError, match_names, to_numpy


#: the dump metadata key of the token positions the head's tensors (``lm_head``, ``logits``) hold
#: rows for: ``"all"`` or a JSON list of increasing positions (workbench/trace/logits.py)
META_LOGITS = "workbench.logit_positions"


def positions_json(positions, T: int):
    return "all" if len(positions) == T and T else [int(p) for p in positions]


def parse_positions(meta: Mapping, T: int | None, where) -> range | tuple | None:
    """The positions a dump's ``workbench.logit_positions`` metadata names (None where it has
    none), or a one-line DumpError: "all" or a list of increasing positions within the ids."""
    raw = meta.get(META_LOGITS)
    if raw is None:
        return None
    try:
        v = json.loads(raw)
    except json.JSONDecodeError:
        v = None
    if v == "all" and T:
        return range(T)
    ok = (isinstance(v, list) and v and all(type(p) is int and 0 <= p < (T or 2**31) for p in v)
          and all(a < b for a, b in zip(v, v[1:])))
    if not ok:
        raise readers.DumpError(f"{where}: metadata {META_LOGITS} is not 'all' or a list of increasing positions "
                                f"within the {T or '?'} tokens ({str(raw)[:60]!r})")
    return range(v[0], v[0] + 1) if len(v) == 1 else tuple(v)


def head_ops(order: Sequence[str]) -> list[str]:
    """The ops that hold the head's rows only (``logits=``): ``lm_head`` and what follows it
    (``logits``), or ``logits`` alone where the head is no op of its own."""
    order = list(order)
    if "lm_head" in order:
        return order[order.index("lm_head"):]
    return ["logits"] if "logits" in order else []


def describe(positions, T: int) -> str:
    """Positions in words ("position 8 (the last) of 9", "positions 0..1 of 9"), a list compacted first."""
    from workbench.trace.logits import describe as words

    ps = [int(p) for p in positions]
    if ps and ps == list(range(ps[0], ps[-1] + 1)):
        return words(range(ps[0], ps[-1] + 1), T)
    return words(tuple(ps), T)


def rows_of(x: np.ndarray, idx: list[int]) -> np.ndarray:
    """Rows ``idx`` of a head tensor [..., P, V] (a [V] tensor is one row)."""
    if x.ndim < 2:
        return x
    return np.take(x, np.asarray(idx, dtype=np.int64), axis=-2)


def align_logits(values: dict, eng: dict, order: Sequence[str], rules, T: int, ref_positions,
                 emeta: Mapping, noise: dict | None = None):
    """Line up the rows of the head's tensors (:func:`head_ops`): ours hold ``ref_positions``
    of the T tokens, the engine's hold every position (T rows), the last alone (one row), or
    what its dump's ``workbench.logit_positions`` says.  Where one side's positions contain the
    other's, both are cut (in place, in ``values``, ``eng`` and ``noise``) to the positions in
    common; otherwise a one-line DiffError naming both.  Returns (the positions compared,
    {"compared", "reference", "engine", "T", "ops"}) or (None, None) when no head tensor matched."""

    heads = [n for n in head_ops(order) if n in values]
    if not heads or not T:
        return None, None
    matched, _, _ = match_names(eng.keys(), heads, rules)
    if not matched:
        return None, None
    ref_pos = list(ref_positions) if ref_positions is not None else list(range(T))
    meta_pos = parse_positions(emeta, T, "the engine's dump") if emeta else None
    found = []  # (our name, engine name, ours, theirs, the engine's positions)
    for name in heads:
        if name not in matched:
            continue
        en = matched[name]
        ours = to_numpy(values[name])
        if ours.ndim < 2 or ours.shape[-2] != len(ref_pos):
            raise DiffError(f"the reference's {name} {list(ours.shape)} does not hold a row for each of its "
                            f"{len(ref_pos)} logit positions ({describe(ref_pos, T)})")
        V = ours.shape[-1]
        theirs = to_numpy(eng[en])
        if theirs.size % V:
            continue  # not [.., rows, vocab]: the comparison says what its shape is
        rows = theirs.size // V
        if meta_pos is not None:
            if len(meta_pos) != rows:
                raise DiffError(f"the engine's {en!r} holds {rows} rows, but its dump's {META_LOGITS} names "
                                f"{len(meta_pos)} positions")
            eng_pos = list(meta_pos)
        elif rows == T:
            eng_pos = list(range(T))
        elif rows == 1:
            eng_pos = [T - 1]  # an engine that computed the head for the last position only
        else:
            raise DiffError(f"logits: the engine's {en!r} holds {rows} rows of the {T}-token input and its dump "
                            f"does not say which positions (not all {T}, not the last alone); the reference holds "
                            f"{describe(ref_pos, T)}: cannot line them up (dump the engine's logits for every "
                            f"position or the last, or name them in {META_LOGITS} metadata)")
        if not (set(ref_pos) <= set(eng_pos) or set(eng_pos) <= set(ref_pos)):
            raise DiffError(f"logits: the engine's {en!r} holds {describe(eng_pos, T)}, the reference "
                            f"{describe(ref_pos, T)}: neither holds the other's, so they cannot be lined up "
                            "(run the reference with logits= the engine's positions, or 'all')")
        found.append((name, en, ours, theirs, eng_pos))
    if not found:
        return None, None
    common = set(ref_pos)
    for *_, eng_pos in found:
        common &= set(eng_pos)
    common = sorted(common)
    if not common:
        raise DiffError("logits: the engine's " + " and ".join(f"{en!r} ({describe(p, T)})" for _, en, _, _, p in found)
                        + " hold no position in common with each other and the reference "
                          f"({describe(ref_pos, T)})")
    for name, en, ours, theirs, eng_pos in found:
        if common != eng_pos:
            if theirs.ndim < 2:
                raise DiffError(f"logits: the engine's {en!r} {list(theirs.shape)} has no row axis to take "
                                f"{describe(common, T)} from")
            eng[en] = rows_of(theirs, [eng_pos.index(p) for p in common])
        if common != ref_pos:
            idx = [ref_pos.index(p) for p in common]
            values[name] = rows_of(ours, idx)
            if noise is not None and name in noise:
                noise[name] = rows_of(to_numpy(noise[name]), idx)
    engine = {en: describe(p, T) for _, en, _, _, p in found}
    return common, {"compared": describe(common, T), "positions": common if len(common) < T else "all",
                    "reference": describe(ref_pos, T), "engine": engine, "T": T,
                    "ops": [name for name, *_ in found]}


def logit_rows_for(positions, T: int, vocab: int | None):
    """The LogitRows the local errors recompute the head for (None: every position)."""
    from workbench.trace.logits import LogitRows

    if positions is None or len(positions) == T:
        return None
    ps = list(positions)
    return LogitRows(range(ps[0], ps[0] + 1) if len(ps) == 1 else tuple(ps), T, "positions", batch=1, vocab=vocab)
