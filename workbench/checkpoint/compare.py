"""``workbench inspect --diff``: what differs between two inspected checkpoints.
:func:`workbench.checkpoint.inspect.diff` inspects both and calls :func:`compare`.

The comparison vouches for nothing it did not check (docs/inspect.md, "Comparing two
checkpoints"): each side is inspected as ``workbench inspect`` would, and a side with an
error (a truncated file, a broken header, NaN with ``--values``, a tensor its config does
not expect, ...) is reported as such, never called the same as the other. It says how
many tensors it compared out of how many; it says ``same`` only when every tensor of
both sides was compared byte for byte (``--values``) and nothing differs; without
``--values`` the most it says is that the headers match (names, shapes, dtypes,
quantization), exit 0, and that the values were not compared.
"""
from __future__ import annotations

import math
import os

from workbench.checkpoint.reader import CheckpointError
from workbench.stats_schema import NONFINITE, SUMMARY

#: bytes compared per read, per side
CHUNK = 8 << 20

#: tensors listed by name in the text view per kind (every one is in --json)
SHOW = 50


def _table(r, ck) -> dict:
    """canonical LM names (fused HF experts split into their halves) + other components as stored"""
    src = {d["name"]: d for d in r.tensors}
    t = {}
    for cn in ck.lm_names():
        ti = ck.info(cn)
        d = src.get(ti.source_name, {})
        q = ck.quant_of(cn[: -len(".weight")]) if cn.endswith(".weight") else None
        t[cn] = {"shape": list(ti.shape), "dtype": ti.dtype, "quantization": q.to_dict() if q else None,
                 "stats": d.get("stats") if ti.part is None else None, "info": ti}
    for name, d in src.items():
        if d["component"] != "language_model":
            t[name] = {"shape": d["shape"], "dtype": d["dtype"], "quantization": None, "stats": d.get("stats"),
                       "info": ck.tensors[name]}
    return t


def _ranges(ck, ti) -> list[tuple[int, int]]:
    """(absolute offset, length) of a tensor's bytes as stored; a half of a fused HF
    ``experts.gate_up_proj`` [.., 2I, D] is the first (gate) or second (up) half of each
    [2I, D] block."""
    if ti.part is None:
        return [(ti.offset, ti.nbytes)]
    src = ck.tensors[ti.source_name]
    blocks = math.prod(src.shape[:-2]) if len(src.shape) > 2 else 1
    blk = src.nbytes // max(blocks, 1)
    half = blk // 2
    start = 0 if ti.part == "gate" else half
    return [(src.offset + b * blk + start, half) for b in range(blocks)]


def _unreadable(ck, ti) -> str | None:
    """Why a tensor's bytes cannot be read (its data lies past the end of its file), or None."""
    sf = ck.sfiles.get(ti.file)
    if sf is None or not sf.readable:
        return f"{ti.file}: its header cannot be read"
    if ti.source_name in sf.truncated:
        return f"{ti.file}: tensor {ti.source_name!r} at byte {ti.offset} lies past the end of the file ({sf.size} bytes)"
    return None


class _Stream:
    """A tensor's bytes read in chunks from its ranges."""

    def __init__(self, ck, ti):
        self.path = os.path.join(str(ck.root), ti.file)
        self.ti = ti
        self.ranges = list(_ranges(ck, ti))
        self.fd = None

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise CheckpointError(f"{self.path}: tensor {self.ti.source_name!r} at byte {self.ti.offset}: "
                                  f"cannot be read ({e.strerror or e})") from None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)

    def chunks(self, size: int):
        for off, n in self.ranges:
            done = 0
            while done < n:
                want = min(size, n - done)
                got = os.pread(self.fd, want, off + done)
                if len(got) != want:  # the file changed under us
                    raise CheckpointError(f"{self.path}: tensor {self.ti.source_name!r}: short read at byte "
                                          f"{off + done} ({len(got)} of {want} bytes): the file changed while "
                                          "it was compared")
                yield got
                done += want


def _bytes_differ(cka, ta, ckb, tb) -> dict | None:
    """None when both tensors' bytes are identical, else {"bytes": differing byte count,
    "first_byte": the first differing byte's offset within the tensor, "of": the tensor's bytes}."""
    import numpy as np

    total = sum(n for _, n in _ranges(cka, ta))
    if total != sum(n for _, n in _ranges(ckb, tb)):
        return {"bytes": None, "first_byte": 0, "of": total}
    count, first, pos = 0, None, 0
    with _Stream(cka, ta) as sa, _Stream(ckb, tb) as sb:
        # both streams cut into equal chunks: the ranges of a tensor's halves are equal-sized too
        buf = b""
        it_b = sb.chunks(CHUNK)
        for x in sa.chunks(CHUNK):
            while len(buf) < len(x):
                buf += next(it_b)
            y, buf = buf[: len(x)], buf[len(x):]
            if x != y:
                ne = np.frombuffer(x, np.uint8) != np.frombuffer(y, np.uint8)
                if first is None:
                    first = pos + int(np.argmax(ne))
                count += int(np.count_nonzero(ne))
            pos += len(x)
    return None if first is None else {"bytes": count, "first_byte": first, "of": total}


def _problems(r) -> list[dict]:
    return [p.to_dict() for p in r.problems if p.severity == "error"]


def compare(ra, cka, rb, ckb, values: bool) -> dict:
    """What differs between two inspected checkpoints (each a Report listing its tensors and
    the Checkpoint it came from): names (canonical for the language model, as stored for
    other components), shapes, dtypes, quantization; with values, statistics and bytes.

    Each side's own errors (``problems``: what ``inspect`` found) keep the verdict off
    ``same``; ``coverage`` says how many tensors were compared out of how many."""
    ta, tb = _table(ra, cka), _table(rb, ckb)
    only_a = sorted(set(ta) - set(tb))
    only_b = sorted(set(tb) - set(ta))
    common = sorted(set(ta) & set(tb))
    shape, dtype, quant, vals, unread = [], [], [], [], []
    compared_values = 0
    for k in common:
        x, y = ta[k], tb[k]
        header_differs = False
        if x["shape"] != y["shape"]:
            shape.append({"tensor": k, "a": x["shape"], "b": y["shape"]})
            header_differs = True
        if x["dtype"] != y["dtype"]:
            dtype.append({"tensor": k, "a": x["dtype"], "b": y["dtype"]})
            header_differs = True
        if x.get("quantization") != y.get("quantization"):
            quant.append({"tensor": k, "a": x.get("quantization"), "b": y.get("quantization")})
        if not values:
            continue
        if header_differs:  # the values cannot be the same: the difference is found
            compared_values += 1
            continue
        why = [f"{side}: {w}" for side, w in (("a", _unreadable(cka, x["info"])), ("b", _unreadable(ckb, y["info"])))
               if w]
        if why:
            unread.append({"tensor": k, "why": "; ".join(why)})
            continue
        changed = {}
        if x.get("stats") and y.get("stats"):
            sx, sy = x["stats"], y["stats"]
            for f in NONFINITE:
                if sx[f] != sy[f]:
                    changed[f] = [sx[f], sy[f]]
            for f in SUMMARY:
                u, v = sx[f], sy[f]
                if (u is None) != (v is None) or (u is not None and not math.isclose(u, v, rel_tol=1e-3, abs_tol=1e-6)):
                    changed[f] = [u, v]
        entry = None
        if changed:
            entry = {"tensor": k, "changed": changed}
        else:  # statistics agree (or were not computed): the bytes decide
            b = _bytes_differ(cka, x["info"], ckb, y["info"])
            if b is not None:
                entry = {"tensor": k, "changed": {}, "bytes": b}
        compared_values += 1
        if entry:
            vals.append(entry)
    pa, pb = _problems(ra), _problems(rb)
    total = len(set(ta) | set(tb))
    differs = bool(only_a or only_b or shape or dtype or quant or vals)
    complete = not unread and (not values or compared_values == len(common))
    if pa or pb:
        verdict = "damaged"
    elif differs:
        verdict = "differ"
    elif not complete:
        verdict = "incomplete"
    else:
        verdict = "same" if values else "headers-match"
    coverage = {"tensors": total, "in_both": len(common), "compared": len(common),
                "values_compared": compared_values if values else None, "not_compared": unread,
                "by": "bytes" if values else "header"}
    return {"a": ra.path, "b": rb.path, "same": verdict == "same", "verdict": verdict,
            "model_type": [ra.model_type, rb.model_type], "problems": {"a": pa, "b": pb}, "coverage": coverage,
            "only_a": only_a, "only_b": only_b, "shape": shape, "dtype": dtype, "quantization": quant,
            "values": vals if values else None}
