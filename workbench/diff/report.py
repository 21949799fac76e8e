"""The diff itself, over plain mappings of arrays: names, layouts, metrics, first divergence.

:func:`compare_arrays` needs no model: give it our activations by op name (numpy or MLX
arrays), the engine's by the engine's names, our execution order and the renaming rules.
``workbench.diff.compare`` runs the reference model and calls it.

This module builds the report; the report itself (:class:`OpDiff`, :class:`DiffReport`, its
coverage and verdict) is workbench/diff/report_data.py and its text workbench/diff/report_text.py;
their names stay importable from here.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from workbench.arrays import to_numpy  # (other diff modules import it from here)
from workbench.diff.layout import LayoutError, reconcile
from workbench.diff.metrics import Tolerance, diverged, error_metrics, noise_limits
from workbench.diff.naming import Rules, RulesError, apply_rules, compile_rules
from workbench.diff.report_data import MIN_COVERAGE, DiffReport, OpDiff  # noqa: F401  (re-exported)
from workbench.diff.where import describe_nonfinite, nonfinite_where, position_profile
from workbench.program import layer_of  # op names: layers.{i}[.…] -> i
from workbench.patterns import UserRegex


class DiffError(ValueError):
    """Input the diff cannot use (two engine tensors for one op, an empty dump, ...)."""


def _topk_alignment(ref: np.ndarray, eng: np.ndarray) -> np.ndarray | None:
    """Per row, the permutation q of the engine's k axis with eng[q] == ref (rows whose sets
    differ keep their order); None when no row needs reordering."""
    r = np.rint(ref).astype(np.int64)
    e = np.rint(eng).astype(np.int64)
    if np.array_equal(r, e):
        return None
    same_set = np.all(np.sort(r, axis=-1) == np.sort(e, axis=-1), axis=-1)
    if not same_set.any():
        return None
    se = np.argsort(e, axis=-1, kind="stable")
    inv_r = np.argsort(np.argsort(r, axis=-1, kind="stable"), axis=-1, kind="stable")
    q = np.take_along_axis(se, inv_r, axis=-1)  # e[q] == sorted(e)[rank of r] == r
    ident = np.broadcast_to(np.arange(r.shape[-1]), r.shape)
    return np.where(same_set[..., None], q, ident)


def match_names(engine_names: Iterable[str], ours: Sequence[str], rules: Rules) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Map engine names through the rules -> ({our op: engine name}, unmatched engine names, renamed)."""
    known = set(ours)
    matched: dict[str, str] = {}
    unmatched: list[str] = []
    renamed: dict[str, str] = {}
    for en in engine_names:
        mapped = apply_rules(en, rules)
        if mapped != en:
            renamed[en] = mapped
        if mapped in known:
            if mapped in matched:
                raise DiffError(f"engine tensors {matched[mapped]!r} and {en!r} both map to op {mapped!r}; "
                                "fix the rules so each op gets one tensor")
            matched[mapped] = en
        else:
            unmatched.append(en)
    return matched, unmatched, renamed


def as_rules(rules: Any) -> Rules:
    """Rules in any form a caller may hold, as naming.compile_rules makes them (every regex a
    time-bounded UserRegex): ``[regex, replacement]`` string pairs are compiled; pairs
    compiled already (as tuples or lists) are kept; a ``re.Pattern`` without flags is
    recompiled from its text (a pattern with flags is refused: write them inline, ``(?i)``)."""
    if rules is None:
        return []
    if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
        return compile_rules(rules)  # names what is wrong
    out = []
    for i, rule in enumerate(rules):  # one pass: an iterator's first rule is not lost
        if isinstance(rule, (list, tuple)) and len(rule) == 2:
            rx, rep = rule
            if isinstance(rx, UserRegex):
                rule = (rx, rep)
            elif isinstance(rx, re.Pattern):
                if rx.flags & ~re.UNICODE:
                    raise RulesError(f"rules: rule {i}: a compiled regex with flags; pass its text with inline "
                                     f"flags, e.g. '(?i){rx.pattern}'")
                rule = [rx.pattern, rep]
        out.append(rule)
    return compile_rules(out)


def compare_arrays(reference: Mapping[str, Any], engine: Mapping[str, Any], order: Sequence[str] | None = None,
                   rules: Rules | Iterable[Sequence[str]] | None = None, tolerance: Tolerance | dict | None = None,
                   inputs: Mapping[str, Sequence[str]] | None = None, noise: Mapping[str, Any] | None = None,
                   noise_dtype: str | None = None, aligned: dict | None = None,
                   topk: Mapping[str, Iterable[str]] | None = None, tokens: int | None = None,
                   empty_ok: bool = False, known: Mapping[str, np.ndarray] | None = None,
                   key_cut=None, notes: Mapping[str, str] | None = None,
                   printed: dict | None = None) -> DiffReport:
    """Compare engine activations with ours.

    ``reference``: our activations by op name (every op of ``order`` that the engine may
    match); ``engine``: the engine's by its own names; ``order``: our execution order
    (default: the reference's key order); ``rules``: ``[regex, replacement]`` pairs or
    compiled rules; ``inputs``: op -> the ops it reads, to say whether the first
    divergence's inputs were still fine; ``noise``: our activations computed in the
    engine's dtype (``noise_dtype``), to hold each op to a multiple of that run's error
    instead of the fixed limits (see :mod:`workbench.diff.metrics`); ``aligned``: a dict
    filled with the engine's tensors brought to our names and layouts; ``topk``: top-k
    index ops -> the ops that depend on them.  Engines list the k selected experts in
    their own order (sorted by score, or not); where a row selects the same set as ours,
    the engine's k axis is put in our order, in the top-k op and in every dependent op
    whose leading dims are the top-k's (router weights ``[.., k]``, expert outputs
    ``[.., k, D]``).  Rows that select different experts are left as they are.
    ``tokens``: the number of input tokens, to profile the error per token position.
    ``empty_ok``: an empty ``engine`` is no error (its dump held only weights, compared apart).
    ``known``: engine name -> bool mask of the elements the dump holds (llama.cpp's eval-callback
    prints a corner of each tensor): the metrics cover those alone.  ``key_cut``: op -> whether
    an engine key axis longer than ours (a padded KV cache) may be cut to ours
    (engines.cut_keys); ``notes``: op -> a layout step an engine adapter took already;
    ``printed``: a dict filled with the partial tensors in our layout, NaN where not printed.
    """
    tol = Tolerance.from_any(tolerance)
    rules = as_rules(rules)
    order = list(order) if order is not None else list(reference)
    if not engine and not empty_ok:
        raise DiffError("the engine dump holds no tensors")
    available = [n for n in order if n in reference]
    matched, unmatched_engine, renamed = match_names(engine.keys(), available, rules)
    pos = {n: i for i, n in enumerate(order)}
    ops: list[OpDiff] = []
    topk = {k: set(v) for k, v in (topk or {}).items()}
    orders: dict[str, np.ndarray] = {}
    for name in sorted(matched, key=pos.__getitem__):
        en = matched[name]
        ref = to_numpy(reference[name])
        eng = to_numpy(engine[en])
        od = OpDiff(op=name, engine_name=en, index=pos[name], layer=layer_of(name), status="ok",
                    shape=tuple(ref.shape), engine_shape=tuple(eng.shape))
        k = None if known is None else known.get(en)
        pre = [notes[name]] if notes and name in notes else []
        try:
            if key_cut is not None and key_cut(name):
                from workbench.diff.engines import cut_keys

                cut = cut_keys(eng, ref.shape, k)
                if cut is not None:
                    eng, k, note = cut
                    pre.append(note)
            if k is None:
                eng, od.layout = reconcile(eng, ref.shape)
            else:  # the same steps for the values and the mask: reconcile the element indices
                idx, od.layout = reconcile(np.arange(eng.size, dtype=np.float64).reshape(eng.shape), ref.shape)
                idx = idx.astype(np.int64)
                eng, k = np.asarray(eng).reshape(-1)[idx], np.asarray(k).reshape(-1)[idx]
            od.layout = "; ".join(x for x in pre + [od.layout] if x)
        except LayoutError as e:
            od.status = e.kind
            od.reasons = [str(e)]
            ops.append(od)
            continue
        if name in topk and eng.shape == ref.shape and eng.ndim >= 1:
            q = _topk_alignment(ref, eng)
            if q is not None:
                orders[name] = q
                eng = np.take_along_axis(eng, q, axis=-1)
                od.layout = (od.layout + "; " if od.layout else "") + "top-k order aligned to ours"
        for src, q in orders.items():
            if name in topk.get(src, ()) and eng.shape[: q.ndim] == q.shape and eng.ndim >= q.ndim:
                qq = q.reshape(q.shape + (1,) * (eng.ndim - q.ndim))
                eng = np.take_along_axis(eng, np.broadcast_to(qq, q.shape + eng.shape[q.ndim:]), axis=q.ndim - 1)
                od.layout = (od.layout + "; " if od.layout else "") + f"k axis in {src}'s order aligned to ours"
        if k is not None and not k.all():
            od.layout = (od.layout + "; " if od.layout else "") + \
                f"compared at the {int(k.sum())} of {k.size} elements the dump prints"
            if printed is not None:
                printed[name] = np.where(k, eng, np.nan)
            ref, eng = ref[k], eng[k]
        else:
            k = None
        if aligned is not None and k is None:
            aligned[name] = eng
        m = error_metrics(ref, eng, mask_below=tol.mask_below)
        od.cosine, od.nmse, od.max_abs, od.max_rel = m["cosine"], m["nmse"], m["max_abs"], m["max_rel"]
        od.nonfinite_ref, od.nonfinite_engine, od.masked = m["nonfinite_ref"], m["nonfinite_engine"], m["masked"]
        if m["nonfinite"]:
            od.finite = {k: m["finite"][k] for k in ("cosine", "nmse", "max_abs", "max_rel", "elements")}
            od.nonfinite = nonfinite_where(ref, eng, tokens if k is None else None, tol.mask_below)
        nm = None
        if noise is not None and name in noise:
            nz = to_numpy(noise[name])
            if nz.shape == ref.shape:
                nm = error_metrics(ref, nz, mask_below=tol.mask_below)
                od.noise_nmse, od.noise_cosine = nm["nmse"], nm["cosine"]
        od.limit_nmse, od.limit_cosine = noise_limits(nm, tol)
        od.reasons = diverged(m, tol, nm, noise_dtype)
        if od.nonfinite is not None:
            od.reasons.append(describe_nonfinite(od.nonfinite))
        if tokens and k is None:
            prof = position_profile(ref, eng, tokens, tol.mask_below)
            od.position_error = None if prof is None else prof.astype(np.float32)
        od.status = "diverged" if od.reasons else "ok"
        ops.append(od)
    unmatched_reference = [n for n in order if n not in matched]
    dropped = [en for en in unmatched_engine if renamed.get(en) == ""]
    suggestions = {}
    for i, en in enumerate(unmatched_engine):
        name = renamed.get(en, en)
        close = difflib.get_close_matches(name, order, n=1, cutoff=0.75)
        if close:
            suggestions[en] = close[0]
            continue
        # else the longest op name inside the engine's, between dots (model.layers.0.q_proj.output)
        dotted = f".{name}."
        inside = [o for o in order if f".{o}." in dotted] if i < 200 else []
        if inside:
            suggestions[en] = max(inside, key=len)
    return DiffReport(ops=ops, order=order, unmatched_engine=unmatched_engine,
                      unmatched_reference=unmatched_reference, tolerance=tol, renamed=renamed,
                      suggestions=suggestions, noise_dtype=noise_dtype if noise is not None else None,
                      inputs={k: tuple(v) for k, v in (inputs or {}).items()},
                      engine_total=len(engine), dropped=dropped,
                      unmatched_nonfinite=nonfinite_counts(engine, [n for n in unmatched_engine if n not in dropped],
                                                           known))


def nonfinite_counts(engine: Mapping[str, Any], names: Sequence[str],
                     known: Mapping[str, np.ndarray] | None = None) -> dict[str, list[int]]:
    """name -> [NaN and +Inf elements, elements] of the engine's float tensors ``names`` that hold
    any (of the elements the dump holds, where ``known`` says which): an engine's NaN or +Inf is a
    finding even where no op of ours is its counterpart.  (-Inf is left out: the fill of the
    attention masks engines dump beside their ops, llama.cpp's KQ_mask.)"""
    out = {}
    for n in names:
        a = to_numpy(engine[n])
        if a.dtype.kind != "f" or not a.size:
            continue
        k = None if known is None else known.get(n)
        bad = np.isnan(a) | np.isposinf(a)
        bad = bad if k is None else bad & k
        count = int(np.count_nonzero(bad))
        if count:
            out[n] = [count, int(a.size if k is None else np.count_nonzero(k))]
    return out
