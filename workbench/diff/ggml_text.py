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

Bounds (the text is untrusted input; every refusal is a :class:`DumpError` of one line naming
the file, the line and the tensor): at most :data:`MAX_BYTES` of text, read a line at a time;
a header or value row is at most :data:`MAX_LINE` bytes (llama.cpp's are a few hundred: a
longer line is skipped as a log line, or refused where it starts like a header or is a value
row), and a header is read in time linear in its length (:func:`parse_header`, no
backtracking); a shape's element count is exact (Python integers), and each tensor's dense
arrays (5 bytes an element, plus ``TENSOR_OVERHEAD``) are charged, before they are made,
against one budget for the dump (``budget=``; by default every dump reader's:
:func:`workbench.diff.readers.read_budget`, a quarter of the memory available).  Lines are split
at "\n" only (their numbers are those ``grep -n`` shows); invalid UTF-8 reads as U+FFFD.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from workbench import fsio
from workbench.diff.readers import DumpError, ReadBudget

#: at most this much text is read (a long prompt of a big model prints ~100 MB)
MAX_BYTES = 2 * 2**30
#: the longest line read as a header or a value row, in bytes: 30x llama.cpp's longest.  Its
#: header (``ggml_debug: %24s = (%s) %10s(%s{%s}, %s}) = {%s}``) holds three names (at most 63
#: bytes: GGML_MAX_NAME), a type, an op and three shapes of four int64 (<= 20 characters
#: each): ~500 at most; a value row the first and last 3 values of ne0 at ``%12.4f`` (a
#: float32 prints at most 45 characters) and "...", ~350 with the indent.  A longer line (a
#: long log line) is read in pieces and skipped, unless it starts like a header (a name of at
#: most 256 characters, then `` = (TYPE) OP(``) or is a value row: then it is refused.
MAX_LINE = 16384
#: the header's parts (GGML's format: ``ggml_debug: %24s = (%s) %10s(%s{%s}, %s}) = {%s}``),
#: read with no backtracking over the line: PREFIX at its start, the shape from its end
#: (the last "{" of the line), then the name up to the first " = (" that TYPE_OP fits
_PREFIX = re.compile(r"\s*(\w+):(\s+)")
_SHAPE = re.compile(r"[-\d, ]+")
_TYPE_OP = re.compile(r"(\w+)\)\s+(\S+?)\(")


def parse_header(line: str) -> tuple[str, str, str, str, str] | None:
    """``(name, type, op, args, shape)`` of a header line, else None; what the regex
    ``^\\s*(\\w+):\\s+(.+?) = \\((\\w+)\\)\\s+(\\S+?)\\((.*)\\) = \\{([-\\d, ]+)\\}\\s*$`` matched (names may
    hold spaces: ggml names views "Qcur-0 (reshaped)"), in time linear in the line's length
    (that regex backtracked quadratically); a line over :data:`MAX_LINE` characters is none."""
    if len(line) > MAX_LINE or " = (" not in line:
        return None
    pre = _PREFIX.match(line)
    body = line.rstrip()
    if pre is None or not body.endswith("}"):
        return None
    brace = body.rfind("{")  # (a shape holds no "{": the last one opens it)
    if brace < 4 or body[brace - 4:brace] != ") = " or not _SHAPE.fullmatch(body, brace + 1, len(body) - 1):
        return None
    close, shape = brace - 4, body[brace + 1:-1]  # close: the ")" ending the args
    start = pre.end()  # the name's first character: every blank after the colon taken first
    k = line.find(" = (", start + 1)
    while 0 <= k < close:  # the shortest name the rest fits (the op: up to its first "(")
        m = _TYPE_OP.match(line, k + 4)
        if m and m.end() <= close:
            return line[start:k], m.group(1), m.group(2), line[m.end():close], shape
        k = line.find(" = (", k + 1)
    # the regex's last resort: its \s+ gives two blanks back and the name is one blank (GGML
    # prints an empty name as 24 spaces: "ggml_debug:                          = (f32) ...")
    if len(pre.group(2)) >= 3 and line.startswith(" = (", start - 1):
        m = _TYPE_OP.match(line, start + 3)
        if m and m.end() <= close:
            return line[start - 2], m.group(1), m.group(2), line[m.end():close], shape
    return None


def _header_name(head: str) -> str | None:
    """The name, where a line's first :data:`MAX_LINE` characters start like a header
    (``WORD: NAME = (TYPE) OP(``, NAME at most 256 characters: GGML's hold 63); else None."""
    pre = _PREFIX.match(head)
    if pre is None:
        return None
    start, end = pre.end(), pre.end() + 256 + 4
    k = head.find(" = (", start + 1, end)
    while k >= 0:
        if _TYPE_OP.match(head, k + 4):
            return head[start:k]
        k = head.find(" = (", k + 1, end)
    return None


def _lines(f, path: Path):
    """``(line number, text, whole)`` for each line of the open file ``f``, split at "\\n" (the
    numbers ``grep -n`` shows); a line over :data:`MAX_LINE` bytes comes as its first MAX_LINE
    bytes with ``whole`` False, the rest read in pieces and dropped.  Invalid UTF-8 reads as U+FFFD."""
    n = total = 0
    while True:
        try:
            raw = f.readline(MAX_LINE + 1)
            whole = len(raw) <= MAX_LINE or raw.endswith(b"\n")
            size = len(raw)
            if not whole:
                while True:
                    piece = f.readline(1 << 20)
                    size += len(piece)
                    if not piece or piece.endswith(b"\n") or total + size > MAX_BYTES:
                        break
        except OSError as e:
            raise DumpError(f"{path}: line {n + 1}: cannot be read ({e.strerror or e})") from None
        if not raw:
            return
        n, total = n + 1, total + size
        if total > MAX_BYTES:
            raise DumpError(f"{path}: over {MAX_BYTES >> 30} GiB of eval-callback text; dump a shorter prompt")
        yield n, raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\n"), whole


def is_eval_callback_text(path: str | os.PathLike) -> bool:
    """Whether one of the first 400 lines (of the first 64 KiB) of ``path`` is a header."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with fsio.open_regular(p) as f:
            head = f.read(1 << 16)
    except (fsio.InputFileError, OSError):
        return False
    return any(parse_header(line.decode("utf-8", "replace")) for line in head.split(b"\n")[:400])


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
            raise DumpError(f"{where}: {tok[:40]!r} is not a number") from None
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


def _label(name: str) -> str:
    """A name as messages show it: quoted, escaped, cut at 80 characters."""
    return repr(name) if len(name) <= 80 else repr(name[:80]) + "..."


class _Tensor:
    """One header's tensor as its value lines come: the arrays are made (after the budget is
    charged) at its first printed value, so a tensor that prints none (quantized) costs nothing."""

    def __init__(self, path: Path, line: int, header: tuple):
        self.path, self.line = path, line
        self.name, self.typ, self.op, _, shape = header
        self.label = _label(self.name)
        try:
            ne = [int(x) for x in shape.split(",") if x.strip()]
        except ValueError:
            raise DumpError(f"{path}: line {line}: tensor {self.label}: shape {{{shape[:80]}}} is not a list of "
                            "sizes") from None
        if len(ne) != 4 or min(ne) < 0:
            raise DumpError(f"{path}: line {line}: tensor {self.label}: shape {{{shape[:80]}}} is not GGML's 4 "
                            "sizes (ne0..ne3, none negative)")
        self.ne = ne
        self.vals = self.known = None
        self.i3 = self.i2 = self.i1 = self.depth = 0

    def shape_text(self) -> str:
        text = ", ".join(map(str, self.ne))
        return "{" + (text if len(text) <= 120 else text[:120] + "...") + "}"

    def allocate(self, budget: ReadBudget) -> None:
        """The arrays, once the budget is charged their 5 bytes an element (float32 values, a bool mask)."""
        ne = self.ne
        budget.charge(f"{self.path}: line {self.line}: tensor {self.label} of shape {self.shape_text()}",
                      math.prod(ne), per_element=5)  # (exact: Python ints)
        self.vals = np.full((ne[3], ne[2], ne[1], ne[0]), np.nan, np.float32)
        self.known = np.zeros(self.vals.shape, bool)

    def put(self, values: list, i0: int, where: str, budget: ReadBudget) -> int:
        """Store a row's ``values`` from element ``i0`` of ne0 on; -> the element after them."""
        ne, i3, i2, i1, end = self.ne, self.i3, self.i2, self.i1, i0 + len(values)
        if not (0 <= i3 < ne[3] and 0 <= i2 < ne[2] and 0 <= i1 < ne[1] and 0 <= i0 and end <= ne[0]):
            raise DumpError(f"{where}: more values than its shape {self.shape_text()} holds")
        if self.vals is None:
            self.allocate(budget)
        self.vals[i3, i2, i1, i0:end] = values
        self.known[i3, i2, i1, i0:end] = True
        return end

    def feed(self, s: str, where: str, budget: ReadBudget) -> bool:
        """Read one stripped line after the header; False: a log line (the tensor has ended)."""
        ne = self.ne
        if s == "[":
            self.depth += 1
            if self.depth == 2:
                self.i1 = 0
        elif s.startswith("...,") or s == "...":
            if self.depth == 1:
                self.i2 = ne[2] - self.i2
            elif self.depth == 2:
                self.i1 = ne[1] - self.i1
        elif s.startswith("[") and s.rstrip(",").endswith("]"):
            row = _floats(s.rstrip(",")[1:-1], where)
            i0 = start = 0
            for j, v in enumerate(row + [None]):  # each run of values between "..." cuts, at once
                if v is not None:
                    continue
                if j > start:
                    i0 = self.put(row[start:j], i0, where, budget)
                if j < len(row):  # "...": the last values of the row follow
                    i0 = ne[0] - i0
                start = j + 1
            self.i1 += 1
        elif s in ("],", "]"):
            if self.depth == 2:
                self.i2 += 1
            elif self.depth == 1:
                self.i2 = 0
                self.i3 += 1
            self.depth = max(self.depth - 1, 0)
        elif not s.startswith("sum =") and self.depth == 0:
            return False
        return True


def read_eval_callback(path: str | os.PathLike, budget: ReadBudget | int | None = None):
    """-> (arrays by name, metadata, known: name -> bool mask of the printed elements).

    ``budget``: a :class:`~workbench.diff.readers.ReadBudget` or bytes the dense arrays may take
    (default: :func:`~workbench.diff.readers.read_budget`); a tensor past it is refused,
    before its arrays are made, in a :class:`DumpError` naming the line."""
    p = Path(path)
    budget = ReadBudget.of(budget)
    tensors: list[tuple[str, str, str, np.ndarray, np.ndarray]] = []
    cur = None

    def finish(t):
        if t is not None and t.vals is not None:
            tensors.append((t.name, t.op, t.typ, t.vals, t.known))

    try:
        f = fsio.open_regular(p)
    except fsio.InputFileError as e:
        raise DumpError(str(e)) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_BYTES:
            raise DumpError(f"{p}: {size} bytes, over {MAX_BYTES >> 30} GiB of eval-callback text; dump a shorter prompt")
        for n, line, whole in _lines(f, p):
            header = parse_header(line) if whole else None
            if header is not None:
                finish(cur)
                cur = _Tensor(p, n, header)
                continue
            s = line.strip()
            if not whole:
                name = _header_name(line)
                if name is not None:
                    raise DumpError(f"{p}: line {n}: tensor {_label(name)}: a header over {MAX_LINE} bytes long "
                                    "(llama.cpp's are at most ~500): not llama.cpp's text")
                if cur is not None and s.startswith("["):
                    raise DumpError(f"{p}: line {n} (tensor {cur.label}): a value row over {MAX_LINE} bytes long "
                                    "(llama.cpp's are at most ~350): not llama.cpp's text")
            if cur is not None and not cur.feed(s, f"{p}: line {n} (tensor {cur.label})", budget):
                finish(cur)
                cur = None
        finish(cur)
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
