"""What `diff --engine` adds to a comparison: the adapter, a decode step's rows, the pattern.

Kept apart from api.py: :func:`adapt` renames an engine's tensors through an adapter
(workbench/diff/engines), :func:`decode_rows` cuts our full forward to the decode
position, :func:`finish` records on the report what the adapter did, :func:`pattern` names
the first finding's pattern (workbench/diff/signature.py).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.diff.engines import Adapter, EngineError, load
from workbench.diff.ggml_text import is_eval_callback_text, read_eval_callback  # noqa: F401  (api reads through here)

META_ENGINE = "workbench.engine"
META_DECODE = "workbench.decode"
META_ENGINE_DTYPE = "workbench.engine_dtype"
#: the local limits of an engine that says it computed in float32 (one op's float32 rounding
#: against MLX's is ~1e-13 nmse): a matmul accumulated in bfloat16 (~1e-4) is then found
FLOAT32_LOCAL = {"local_max_nmse": 1e-6, "local_min_cosine": 1 - 1e-6}


def engine_tolerance(tolerance, emeta: Mapping[str, str]):
    """The tolerance to use: an engine whose dump says it computed in float32 is held locally
    to float32 rounding (:data:`FLOAT32_LOCAL`) unless the local limits were set apart from
    their defaults."""
    import dataclasses

    from workbench.diff.metrics import Tolerance

    if emeta.get(META_ENGINE_DTYPE) != "float32":
        return tolerance
    tol = Tolerance.from_any(tolerance)
    d = Tolerance()
    if tol.local_max_nmse != d.local_max_nmse or tol.local_min_cosine != d.local_min_cosine:
        return tol
    return dataclasses.replace(tol, **FLOAT32_LOCAL)
#: ops whose token axis is the third ([B, H, T, ...]); the rest have it second ([B, T, ...])
HEADS_FIRST = ("q_heads", "k_heads", "v_heads", "q_rope", "k_rope", "q_norm", "k_norm", "v_norm", "scores", "softmax")


def adapter_for(name: str | None, emeta: Mapping[str, str]) -> Adapter | None:
    """The adapter asked for, else the one the dump's metadata names, else None."""
    name = name or emeta.get(META_ENGINE) or None
    if not name:
        return None
    try:
        return load(name)
    except EngineError:
        if emeta.get(META_ENGINE) == name:
            return None  # a dump naming an engine we have no adapter for: compared by its names
        raise


def _family_and_head_dim(model: Any) -> tuple[str | None, int | None]:
    cfg = None
    if isinstance(model, (str, os.PathLike)):
        p = Path(model)
        p = p if p.is_dir() else p.parent
        from workbench import fsio

        try:  # (a reference dump names this path: a FIFO or /dev/zero there is refused, not read)
            cfg = fsio.read_json(p / "config.json", fsio.MAX_CONFIG)
        except (OSError, ValueError):
            return None, None
    elif model is not None:
        prog = getattr(model, "program", None)
        hd = None
        for op in getattr(prog, "ops", ()) or ():
            if getattr(op, "attrs", None) and "head_dim" in op.attrs:
                hd = int(op.attrs["head_dim"])
                break
        cfg = getattr(model, "config", None)
        fam = getattr(model, "family", None)
        mt = cfg.get("model_type") if isinstance(cfg, dict) else None
        return (mt or (fam if isinstance(fam, str) else None)), hd
    if not isinstance(cfg, dict):
        return None, None
    cfg = cfg.get("text_config", cfg) if "text_config" in cfg and "num_attention_heads" not in cfg else cfg
    hd = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // max(cfg.get("num_attention_heads", 1), 1) or None)
    return cfg.get("model_type"), hd


def adapt(adapter: Adapter | None, eng: dict, order: Sequence[str], model: Any, known):
    """(engine tensors under our names, their printed-element masks, what the adapter did)."""
    if adapter is None:
        return eng, known, {}
    family, head_dim = _family_and_head_dim(model)
    out, info = adapter.apply(eng, order, family=family, head_dim=head_dim, known=known)
    return out, (info["known"] if known is not None else None), info


def choose(eng: dict, ours: Mapping[str, Any], info: dict) -> None:
    """Put each engine tensor whose name the engine gives several nodes (``info["alternatives"]``:
    the op it is held under -> the ops it may be) under the op it fits best (lowest nmse over
    its printed elements, in our layout), and say which in the layout notes."""
    from workbench.diff.layout import LayoutError, reconcile
    from workbench.diff.metrics import error_metrics
    from workbench.diff.report import to_numpy

    for held, cands in list((info.get("alternatives") or {}).items()):
        v, mask = eng.get(held), (info.get("known") or {}).get(held)
        if v is None:
            continue
        fits = []
        for c in cands:
            if c not in ours or (c != held and c in eng):
                continue
            r = to_numpy(ours[c])
            try:
                e, _ = reconcile(np.asarray(v), r.shape)
                k = None if mask is None else reconcile(np.asarray(mask), r.shape)[0]
            except (LayoutError, ValueError):
                continue
            m = error_metrics(r if k is None else r[k], e if k is None else e[k])
            nmse = (m.get("finite") or m)["nmse"]
            if nmse is not None and np.isfinite(nmse):
                fits.append((nmse, c))
        if not fits:
            continue
        fits.sort()
        best = fits[0][1]
        en = info["engine_names"].pop(held)
        eng[best] = eng.pop(held)
        if mask is not None:
            info["known"][best] = info["known"].pop(held)
        info["engine_names"][best] = en
        note = info["notes"].pop(held, None)
        others = ", ".join(f"{c} {n:.2g}" for n, c in fits[1:])
        info["notes"][best] = ((note + "; ") if note else "") + (
            f"{en!r} names several nodes: it fits {best} (nmse {fits[0][0]:.2g})" + (f", not {others}" if others else ""))
        if best != cands[0]:  # (the node written last fits worse: e.g. an engine whose RoPE did nothing)
            info.setdefault("cautions", []).append(
                f"{en!r} fits {best} better than {cands[0]}, the node an engine writes last under that name: "
                f"if its dump keeps the last one written, {cands[0]} did not change its input; check it")


#: the ops that hold the residual stream, one row per position (``embed_tokens``, ``layers.{i}``):
#: where the positions are counted
STREAM = re.compile(r"embed_tokens|layers\.\d+")


def infer_decode(ours: Mapping[str, Any], eng: Mapping[str, Any], rules, T: int, where: str) -> tuple[bool, str | None]:
    """Whether an engine's dump holds one decode step, read from its shapes where neither the
    caller nor its metadata said: the first residual-stream op the engine dumped (:data:`STREAM`)
    holds ``T`` positions of ours; the engine's, as many elements as ours (the prompt: False), or
    one position's (True, with the note saying so).  Another count is a DiffError naming both
    and the options."""
    from workbench.diff.report import DiffError, match_names

    order = [n for n in ours if STREAM.fullmatch(n)]
    matched, _, _ = match_names(eng.keys(), order, rules)
    for op in order:
        if op not in matched:
            continue
        mine, theirs = np.shape(ours[op]), np.shape(eng[matched[op]])
        per_row = math.prod(mine) // T if T else 0
        size = math.prod(theirs)
        if T <= 1 or not per_row or size == per_row * T:
            return False, None
        if size == per_row:
            return True, (f"read as one decode step: the engine's {matched[op]!r} holds one position "
                          f"({list(theirs)}), the prompt {T}")
        raise DiffError(f"{where}: the engine's {matched[op]!r} {list(theirs)} holds {size / per_row:g} positions' "
                        f"values, our {op} {list(mine)} {T}: give the prompt the engine ran (--ids/--prompt), "
                        "or --decode for a dump of the last token's decode step")
    return False, None


def decode_rows(values: Mapping[str, Any], heads: Sequence[str], T: int) -> dict:
    """Our full forward's values cut to the row of position T - 1 (the decode step's token) on
    every op with a token axis; the caches (all positions) and the head (lined up by
    api.align_logits; ``heads``: their names) are left whole."""
    from workbench.diff.report import to_numpy

    heads = set(heads)
    out = {}
    for name, v in values.items():
        leaf = name.rsplit(".", 1)[-1]
        if name in heads or leaf.endswith("_cache"):
            out[name] = v
            continue
        a = to_numpy(v)
        axis = 2 if leaf in HEADS_FIRST else 1
        out[name] = a[(slice(None),) * axis + (slice(T - 1, T),)] if a.ndim > axis and a.shape[axis] == T else a
    return out


def output_rows(values: Mapping[str, Any], eng: Mapping[str, Any], heads: Sequence[str], T: int,
                notes: dict) -> dict:
    """llama.cpp keeps only the output rows (the last token) in its last layer from attn_out on
    (``inp_out_ids``): where an engine tensor holds one position's elements and ours T, ours is
    cut to the last position (and the layout note says so)."""
    from workbench.diff.report import to_numpy

    if T <= 1:
        return dict(values)
    heads = set(heads)
    out = dict(values)
    for name, v in values.items():
        if name in heads or name not in eng:
            continue
        a = to_numpy(v)
        e = np.asarray(eng[name])
        if e.size * T != a.size:
            continue
        axis = 2 if name.rsplit(".", 1)[-1] in HEADS_FIRST else 1
        if a.ndim > axis and a.shape[axis] == T:
            out[name] = a[(slice(None),) * axis + (slice(T - 1, T),)]
            notes[name] = "the engine holds the last position only (its output rows): compared there"
    return out


def finish(report, adapter: Adapter | None, info: Mapping, decode: bool, decode_note: str | None = None) -> None:
    report.decode = bool(decode)
    report.decode_note = decode_note
    report.cautions = list(info.get("cautions", ()))
    if adapter is None:
        return
    report.engine = adapter.name
    names = info.get("engine_names", {})
    for od in report.ops:
        if od.op in names:
            od.engine_name = names[od.op]
    report.renamed = {**{en: op for op, en in names.items() if en != op}, **report.renamed}
    dropped = info.get("dropped", {})
    report.dropped_why = dict(dropped)
    report.dropped = list(report.dropped) + [d for d in dropped if d not in report.dropped]
    if report.engine_total is not None:
        report.engine_total += len(dropped)


def pattern(report, ref: Mapping[str, Any], aligned: Mapping[str, Any], model: Any, decode: bool):
    from workbench.diff import signature

    try:
        return signature.read(report, ref, aligned, model=model, decode=decode)
    except (ValueError, TypeError, FloatingPointError, IndexError):  # a reading, never a failure of the diff
        return None
