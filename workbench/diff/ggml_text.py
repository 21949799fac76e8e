"""Read llama.cpp's eval-callback text (``llama-eval-callback ... > dump.txt``) as an engine dump.

llama.cpp's ``examples/eval-callback`` prints, for every node of the graph as it is computed::

    ggml_debug:              attn_norm-0 = (f32)        MUL(norm-0{2560, 1, 1, 1}, blk.0.attn_norm.weight{2560, 1, 1, 1}}) = {2560, 1, 1, 1}
                                         [
                                          [
                                           [ -0.1800,   0.2817,   0.2632, ..., ],
                                          ],
                                         ]
                                         sum = 0.123400

the name, type, op and shape (GGML's ``ne``: innermost first), then the values (``%12.4f``),
the first and last n (3) along each of ne0, ne1, ne2 only when a dimension is longer than
2n (``...`` marks the cut), every ne3 block, and a sum.  Quantized tensors print no values.

What can be compared: **the printed elements only**, each to 4 decimals.  A tensor is read
as an array of GGML's shape (numpy order: ``ne`` reversed) holding the printed values and
NaN elsewhere, with a mask of the printed elements; the diff computes its metrics over the
printed elements alone (``known`` in the report's layout note) and never calls the unprinted
ones fine or wrong.  In a model of real size that is the 6 x 6 x 6 corner of each tensor:
enough to catch a wrong scale, norm, RoPE frequency or position (they touch every element),
not an error confined to unprinted channels or tokens.  The printed ``sum`` adds up the
printed elements only (the loop that prints it skips the same ones), so it is not used.
A name printed for several nodes (``Qcur-0`` after MUL_MAT and ROPE) is read as
``NAME@OP`` (``Qcur-0@ROPE``), and a name and op printed again (``ffn_post_norm``, which Gemma's
graph names without its layer) as ``NAME@OP#k``, k counting from 0 in print order; a node with GGML's default name ``node_N``
(llama.cpp 4227c9b leaves K.Q, the softmax and KQ.V unnamed) as ``node-IL@OP`` (IL: the layer
of the named node printed before it); lines that are not part of a tensor (logs) are skipped.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from workbench import fsio
from workbench.diff.readers import DumpError

#: (names may hold spaces: ggml names views "Qcur-0 (reshaped)", "kq-0 (permuted)")
HEADER = re.compile(r"^\s*(\w+):\s+(.+?) = \((\w+)\)\s+(\S+?)\((.*)\) = \{([-\d, ]+)\}\s*$")
#: at most this much text is read (a long prompt of a big model prints ~100 MB)
MAX_BYTES = 2 * 2**30


def is_eval_callback_text(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with fsio.open_regular(p) as f:
            head = f.read(1 << 16)
    except (fsio.InputFileError, OSError):
        return False
    try:
        text = head.decode("utf-8", "replace")
    except Exception:
        return False
    return any(HEADER.match(line) for line in text.splitlines()[:400])


def _floats(body: str, where: str) -> list:
    out = []
    for tok in body.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if tok == "...":
            out.append(None)
            continue
        try:
            out.append(float(tok))
        except ValueError:
            raise DumpError(f"{where}: {tok!r} is not a number") from None
    return out


_UNNAMED = re.compile(r"node_\d+")
_LAYER = re.compile(r"^[^ ]*-(\d+)(?: |$)")


def _name_unnamed(tensors: list) -> list:
    """GGML names a node its graph builder left unnamed ``node_N`` (N: its index in that graph):
    llama.cpp 4227c9b prints K.Q, the softmax and KQ.V of every layer so.  Such a node is read as
    ``node-IL`` (IL: the layer of the last named node printed before it), and with its op as
    any repeated name is (``node-0@SOFT_MAX``); before any layer it keeps its name."""
    out, il = [], None
    for t in tensors:
        name = t[0]
        if _UNNAMED.fullmatch(name):
            if il is not None:
                t = (f"node-{il}",) + tuple(t[1:])
        else:
            m = _LAYER.match(name)
            if m:
                il = m.group(1)
        out.append(t)
    return out


def read_eval_callback(path: str | os.PathLike):
    """-> (arrays by name, metadata, known: name -> bool mask of the printed elements)."""
    p = Path(path)
    try:
        with fsio.open_regular(p) as f:
            raw = f.read(MAX_BYTES + 1)
    except fsio.InputFileError as e:
        raise DumpError(str(e)) from None
    if len(raw) > MAX_BYTES:
        raise DumpError(f"{p}: over {MAX_BYTES >> 30} GiB of eval-callback text; dump a shorter prompt")
    lines = raw.decode("utf-8", "replace").splitlines()
    tensors: list[tuple[str, str, str, np.ndarray, np.ndarray]] = []
    i = 0
    while i < len(lines):
        m = HEADER.match(lines[i])
        if not m:
            i += 1
            continue
        name, typ, op = m.group(2), m.group(3), m.group(4)
        try:
            ne = [int(x) for x in m.group(6).split(",") if x.strip()]
        except ValueError:
            raise DumpError(f"{p}: line {i + 1}: shape {m.group(6)!r} is not a list of sizes") from None
        if len(ne) != 4 or min(ne) < 0 or int(np.prod(ne, dtype=np.int64)) > 2**31:
            raise DumpError(f"{p}: line {i + 1}: tensor {name!r}: shape {ne} is not GGML's 4 sizes")
        i += 1
        vals = np.full((ne[3], ne[2], ne[1], ne[0]), np.nan, np.float32)
        known = np.zeros(vals.shape, bool)
        i3 = i2 = i1 = 0
        depth = 0
        printed = False
        while i < len(lines) and not HEADER.match(lines[i]):
            s = lines[i].strip()
            where = f"{p}: line {i + 1} (tensor {name!r})"
            i += 1
            if s == "[":
                depth += 1
                if depth == 2:
                    i1 = 0
                continue
            if s.startswith("...,") or s == "...":
                if depth == 1:
                    i2 = ne[2] - i2
                elif depth == 2:
                    i1 = ne[1] - i1
                continue
            if s.startswith("[") and s.rstrip(",").endswith("]"):
                row = _floats(s.rstrip(",")[1:-1], where)
                i0 = 0
                for v in row:
                    if v is None:
                        i0 = ne[0] - i0
                        continue
                    if not (i3 < ne[3] and i2 < ne[2] and i1 < ne[1] and i0 < ne[0]):
                        raise DumpError(f"{where}: more values than its shape {ne} holds")
                    vals[i3, i2, i1, i0] = v
                    known[i3, i2, i1, i0] = True
                    i0 += 1
                    printed = True
                i1 += 1
                continue
            if s in ("],", "]"):
                if depth == 2:
                    i2 += 1
                elif depth == 1:
                    i2 = 0
                    i3 += 1
                depth = max(depth - 1, 0)
                continue
            if s.startswith("sum ="):
                continue
            if depth == 0:  # a log line after the tensor
                break
        if printed:
            tensors.append((name, op, typ, vals, known))
    if not tensors:
        raise DumpError(f"{p}: no tensor values in llama.cpp eval-callback format (ggml_debug: NAME = (f32) OP(...) = {{...}})")
    tensors = _name_unnamed(tensors)
    count: dict[str, int] = {}
    for name, *_ in tensors:
        count[name] = count.get(name, 0) + 1
    keyed = [(name if count[name] == 1 else f"{name}@{op}") for name, op, *_ in tensors]
    repeats: dict[str, int] = {}
    for k in keyed:
        repeats[k] = repeats.get(k, 0) + 1
    arrays, masks, seen = {}, {}, {}
    types = {}
    for key, (name, op, typ, vals, known) in zip(keyed, tensors):
        if repeats[key] > 1:  # the same name and op again (a name given without the layer: il = -1)
            seen[key] = seen.get(key, -1) + 1
            key = f"{key}#{seen[key]}"
        arrays[key], masks[key] = vals, known
        types[key] = typ
    partial = sum(not k.all() for k in masks.values())
    meta = {"workbench.engine": "llama.cpp", "workbench.engine_format": "eval-callback text",
            "workbench.partial_tensors": str(partial)}
    return arrays, meta, masks
