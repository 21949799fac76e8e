"""Safetensors files, read defensively: header-only parsing, lazy data access.

Nothing here trusts the file: the header length is checked against the 100 MB cap and
the file size before anything is allocated, every tensor's offsets are checked against
its dtype x shape and against its neighbours, and a data section that runs past the end
of the file is reported (``truncated-file``), never read.  Problems are returned as
plain dicts (``code``, ``message``, ``tensor``, ``offset``) so the inspector can turn
them into report entries; :class:`SafetensorsFile` never raises for bad content.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from workbench.fsio import InputFileError, open_regular

#: safetensors header cap (the reference implementation refuses anything larger)
MAX_HEADER = 100_000_000

#: dtype -> bits per element
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"}

_NP = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "I64": np.int64, "U64": np.uint64, "F64": np.float64, "F8_E5M2": np.uint8, "F8_E4M3": np.uint8,
    "F8_E8M0": np.uint8,
}


def nbytes_of(dtype: str, shape) -> int:
    n = math.prod(shape) if shape else 1
    return (n * DTYPE_BITS[dtype] + 7) // 8


@dataclass
class RawTensor:
    name: str
    dtype: str
    shape: tuple
    begin: int  # relative to the data section
    end: int


@dataclass
class SafetensorsFile:
    """One parsed file. ``tensors`` holds only entries that are sound; ``problems``
    lists everything wrong with the file (codes ``bad-header``, ``truncated-file``)."""

    path: str
    size: int = 0
    header_len: int = 0
    data_start: int = 0
    tensors: dict = field(default_factory=dict)  # name -> RawTensor
    metadata: dict | None = None
    problems: list = field(default_factory=list)
    readable: bool = False  # header parsed (tensors may still be truncated)
    truncated: set = field(default_factory=set)  # tensor names whose data lies past EOF
    broken: set = field(default_factory=set)  # tensor names whose header entry is unsound
    unreadable: str | None = None  # why the file could not be opened at all (not a regular file, permissions)

    def abs_offset(self, t: RawTensor) -> int:
        return self.data_start + t.begin

    # ------------------------------------------------------------------ parsing
    @classmethod
    def parse(cls, path: str) -> "SafetensorsFile":
        f = cls(path=path)
        name = os.path.basename(path)

        def bad(msg, tensor=None, offset=None, code="bad-header", severity="error"):
            if tensor is not None and severity == "error" and code == "bad-header":
                f.broken.add(tensor)
            f.problems.append({"code": code, "severity": severity, "message": f"{name}: {msg}",
                               "tensor": tensor, "offset": offset})

        try:  # only a regular file; the open cannot block on a FIFO
            fh = open_regular(path)
        except InputFileError as e:
            f.unreadable = str(e)
            f.problems.append({"code": "bad-header", "severity": "error", "message": str(e), "tensor": None,
                               "offset": None})
            return f
        with fh:
            f.size = os.fstat(fh.fileno()).st_size
            if f.size < 8:
                bad(f"file is {f.size} bytes, too short for the 8-byte header length at offset 0", offset=0)
                return f
            (n,) = struct.unpack("<Q", fh.read(8))
            f.header_len = n
            if n > MAX_HEADER:
                bad(f"header length {n} at offset 0 exceeds the 100 MB safetensors cap", offset=0)
                return f
            if 8 + n > f.size:
                bad(f"header length {n} at offset 0 runs past the end of the file ({f.size} bytes)", offset=0)
                return f
            raw = fh.read(n)
        f.data_start = 8 + n
        if len(raw) != n:
            bad(f"could read only {len(raw)} of {n} header bytes", offset=8)
            return f
        dup = []

        def hook(pairs):
            d = {}
            for k, v in pairs:
                if k in d:
                    dup.append(k)
                d[k] = v
            return d

        try:
            text = raw.decode("utf-8")
            hdr = json.loads(text.rstrip(" \x00"), object_pairs_hook=hook)
        except UnicodeDecodeError as e:
            bad(f"header is not UTF-8 (byte {8 + e.start})", offset=8 + e.start)
            return f
        except json.JSONDecodeError as e:
            bad(f"header is not valid JSON: {e.msg} at byte {8 + e.pos}", offset=8 + e.pos)
            return f
        except (RecursionError, ValueError) as e:
            bad(f"header JSON cannot be parsed ({type(e).__name__})", offset=8)
            return f
        if not isinstance(hdr, dict):
            bad(f"header is a JSON {type(hdr).__name__}, not an object", offset=8)
            return f
        for k in dup:
            bad(f"tensor {k!r} appears twice in the header", tensor=k, offset=8, code="duplicate-tensor")
        meta = hdr.pop("__metadata__", None)
        if meta is not None and not isinstance(meta, dict):
            bad("__metadata__ is not an object", offset=8)
            meta = None
        f.metadata = meta
        entries = []
        for k, v in hdr.items():
            if not isinstance(v, dict):
                bad(f"entry for tensor {k!r} is not an object", tensor=k, offset=8)
                continue
            dt, shape, offs = v.get("dtype"), v.get("shape"), v.get("data_offsets")
            if not isinstance(dt, str) or dt not in DTYPE_BITS:
                bad(f"tensor {k!r} has unknown dtype {dt!r}", tensor=k, offset=8)
                continue
            if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
                bad(f"tensor {k!r} has an invalid shape {shape!r}", tensor=k, offset=8)
                continue
            if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)
                    and offs[0] <= offs[1]):
                bad(f"tensor {k!r} has invalid data_offsets {offs!r}", tensor=k, offset=8)
                continue
            want = nbytes_of(dt, shape)
            if offs[1] - offs[0] != want:
                bad(f"tensor {k!r}: data_offsets {offs} span {offs[1] - offs[0]} bytes but {dt} x {shape} "
                    f"needs {want} (at byte {f.data_start + offs[0]})", tensor=k, offset=f.data_start + offs[0])
                continue
            entries.append(RawTensor(k, dt, tuple(shape), offs[0], offs[1]))
        entries.sort(key=lambda t: (t.begin, t.end))
        pos = 0
        ok = []
        for t in entries:
            if t.begin < pos:
                bad(f"tensor {t.name!r} at byte {f.data_start + t.begin} overlaps the previous tensor "
                    f"(which ends at byte {f.data_start + pos})", tensor=t.name, offset=f.data_start + t.begin)
                continue
            if t.begin > pos:
                bad(f"gap of {t.begin - pos} bytes before tensor {t.name!r} at byte {f.data_start + pos}",
                    tensor=t.name, offset=f.data_start + pos)
            pos = t.end
            ok.append(t)
        f.readable = True
        end = f.data_start + pos
        for t in ok:
            f.tensors[t.name] = t
            if f.data_start + t.end > f.size:
                f.truncated.add(t.name)
        if end > f.size:
            first = min((t for t in ok if t.name in f.truncated), key=lambda t: t.begin)
            bad(f"data section needs {end} bytes but the file holds {f.size}: {len(f.truncated)} tensor(s) "
                f"cut off, first {first.name!r} at byte {f.data_start + first.begin}",
                tensor=first.name, offset=f.data_start + first.begin, code="truncated-file")
        elif end < f.size:
            bad(f"{f.size - end} unused bytes after the data section (byte {end})", offset=end, severity="warning")
        return f

    # --------------------------------------------------------------- data access
    def read_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, unique, in range) of a tensor of two or more axes, read with
        one ``pread`` per contiguous run: [len(rows), *shape[1:]] (BF16 as uint16 bits)."""
        t = self.tensors[name]
        npdt = _NP.get(t.dtype)
        if name in self.truncated or npdt is None or len(t.shape) < 2:
            raise ValueError(f"{os.path.basename(self.path)}: tensor {name!r} cannot be read by rows")
        if len(rows) and (rows[0] < 0 or rows[-1] >= t.shape[0]):  # (sorted: the ends bound them all)
            raise ValueError(f"{os.path.basename(self.path)}: tensor {name!r}: rows {int(rows[0])}..{int(rows[-1])} "
                             f"outside its {t.shape[0]}")
        row = (t.end - t.begin) // t.shape[0]
        out = bytearray(len(rows) * row)
        base = self.abs_offset(t)
        with open_regular(self.path) as fh:  # (a regular file still: nothing swapped in can hang the read)
            fd = fh.fileno()
            i = 0
            while i < len(rows):
                j = i + 1
                while j < len(rows) and rows[j] == rows[j - 1] + 1:
                    j += 1
                want = (j - i) * row
                got = os.pread(fd, want, base + int(rows[i]) * row)
                if len(got) != want:
                    raise ValueError(f"{os.path.basename(self.path)}: tensor {name!r}: short read")
                out[i * row:j * row] = got
                i = j
        return np.frombuffer(out, dtype=npdt).reshape((len(rows),) + tuple(t.shape[1:]))

    def read_numpy(self, name: str) -> np.ndarray:
        """The tensor's raw elements as a numpy array (BF16 as uint16 bits), copied."""
        t = self.tensors[name]
        if name in self.truncated:
            raise ValueError(f"{os.path.basename(self.path)}: tensor {name!r} at byte "
                             f"{self.abs_offset(t)} lies past the end of the file")
        npdt = _NP.get(t.dtype)
        if npdt is None:
            raise ValueError(f"{os.path.basename(self.path)}: tensor {name!r}: dtype {t.dtype} not supported")
        with open(self.path, "rb") as fh:
            fh.seek(self.abs_offset(t))
            buf = fh.read(t.end - t.begin)
        return np.frombuffer(buf, dtype=npdt).reshape(t.shape)
