"""Reading engine dumps and writing reference dumps.

An engine dump is one of:

* a ``.safetensors`` file (any of F64/F32/F16/BF16 and the integer/bool dtypes);
* a ``.npz`` archive, read member by member (``np.lib.format.read_array(allow_pickle=False)``:
  object arrays are refused);
* a directory of ``.npy`` files (searched recursively; a file's name, relative to the
  directory, without ``.npy`` and with ``/`` kept, is the tensor name).

Every tensor is returned as a float32 ``numpy`` array keyed by its name in the dump.  The
file is never modified.  Anything unreadable raises :class:`DumpError` naming the file,
the tensor and, for safetensors, the byte offset.

Bounds: a tensor's size is read from its header with exact integer arithmetic and checked,
before anything is allocated, against the bytes the file holds for it (safetensors: its
offsets and the file size; ``.npy``: the file or archive member after the header) and against
one :class:`ReadBudget` for the dump: the float32 arrays (4 bytes an element, plus
:data:`TENSOR_OVERHEAD` a tensor; and, while a tensor is read, its raw data unless it is
float32) may take :data:`BUDGET_FRACTION` of the memory available (:func:`read_budget`).
An ``.npz`` member's size is its archive's word: a deflated member of zeros is ~1000x
smaller than it unpacks to, so the budget, not the file size, bounds it.

bfloat16 has no numpy dtype: in safetensors it is ``BF16``; in ``.npy``/``.npz`` files
written through ``ml_dtypes`` it appears as the 2-byte void dtype ``V2`` and is read as
bfloat16 too.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from workbench import dtypes, fsio
from workbench.sizes import fmt_bytes

#: metadata keys of a reference dump written by :func:`write_dump`
META_FORMAT = "workbench.format"
META_ORDER = "workbench.op_order"
META_IDS = "workbench.ids"
META_MODEL = "workbench.model"
META_DTYPE = "workbench.dtype"
FORMAT = "workbench.dump/1"


class DumpError(ValueError):
    """An engine or reference dump that cannot be read (unusable input)."""


#: the arrays read from one dump may take this fraction of the memory available
#: (workbench.device_memory.available_memory: MemAvailable / the cgroup's limit, or
#: WORKBENCH_MEMORY_AVAILABLE): a comparison holds them, the reference's trace of the same ops
#: (about as large), the model's weights and its work, so a dump past a quarter would leave
#: the comparison itself out of memory
BUDGET_FRACTION = 0.25
#: the budget where the memory available is unknown
FALLBACK_BUDGET = 4 * 2**30
#: bytes a tensor costs besides its elements (its arrays' objects, its name, dict entries:
#: ~500 measured, ~800 while the names are keyed), so that a dump of many one-element
#: tensors is bounded too
TENSOR_OVERHEAD = 2048


def read_budget() -> tuple[int, str]:
    """(bytes one dump's arrays may take, where the figure comes from): :data:`BUDGET_FRACTION`
    of the memory available, else :data:`FALLBACK_BUDGET`."""
    from workbench.device_memory import MEMORY_ENV, available_memory

    avail, source = available_memory()
    if avail is None:
        return FALLBACK_BUDGET, f"a fixed {fmt_bytes(FALLBACK_BUDGET)}: the memory available is unknown ({MEMORY_ENV} sets it)"
    of = f"the {fmt_bytes(avail)} {MEMORY_ENV} gives" if source == MEMORY_ENV else \
        f"the {fmt_bytes(avail)} of memory available, {source}; {MEMORY_ENV} sets it"
    return int(avail * BUDGET_FRACTION), f"{BUDGET_FRACTION:.0%} of {of}"


class ReadBudget:
    """The bytes one dump's arrays may take (``limit``: bytes, default :func:`read_budget`),
    each tensor charged, before its arrays are made, by :meth:`charge`."""

    def __init__(self, limit: int | None = None):
        self.limit, self.source = read_budget() if limit is None else (int(limit), "the budget given")
        self.used = 0

    @classmethod
    def of(cls, budget: "ReadBudget | int | None") -> "ReadBudget":
        return budget if isinstance(budget, ReadBudget) else cls(budget)

    def charge(self, what: str, elements: int, per_element: int = 4, transient: int = 0) -> None:
        """Charge ``elements`` (exact) x ``per_element`` bytes plus :data:`TENSOR_OVERHEAD` for
        ``what`` (file, line or offset, tensor, shape), kept; ``transient``: bytes it needs
        only while it is read (its raw data before the float32 copy).  A one-line DumpError
        where the two pass the limit."""
        keep = elements * per_element + TENSOR_OVERHEAD
        need = keep + transient
        if self.used + need > self.limit:
            before = f"with the {fmt_bytes(self.used)} of the tensors before it, " if self.used else ""
            raise DumpError(f"{what} needs {need} bytes ({fmt_bytes(need)}) in memory: {before}over the "
                            f"{fmt_bytes(self.limit)} budget for one dump's arrays ({self.source}); dump a "
                            "shorter prompt, fewer ops or a smaller model")
        self.used += keep


_ST_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # decoded below
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16 or 2-byte void) -> float32, exactly (:func:`workbench.dtypes.bf16_to_f32`)."""
    return dtypes.bf16_to_f32(raw)


def _to_f32(arr: np.ndarray, where: str) -> np.ndarray:
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
        return bf16_to_f32(arr)
    if arr.dtype.kind not in "fiub":
        raise DumpError(f"{where}: dtype {arr.dtype} is not numeric")
    return np.asarray(arr, dtype=np.float32)


def read_safetensors(path: str | os.PathLike, names: Iterable[str] | None = None,
                     budget: ReadBudget | int | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file (only ``names`` if given) -> (float32 arrays, metadata).

    Parsing is the checkpoint reader's defensive one (:class:`SafetensorsFile`: header cap,
    offsets against dtype x shape, neighbours and file size); its first error is raised.
    ``budget``: a :class:`ReadBudget` or its limit in bytes (default: :func:`read_budget`).
    """
    from workbench.checkpoint.sfile import SafetensorsFile

    path = Path(path)
    budget = ReadBudget.of(budget)
    sf = SafetensorsFile.parse(str(path))
    errors = [p for p in sf.problems if p.get("severity") == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise DumpError(f"{path.parent / errors[0]['message']}{more}")
    wanted = list(sf.tensors) if names is None else list(names)
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        t = sf.tensors.get(name)
        if t is None:
            raise DumpError(f"{path}: no tensor named {name!r}")
        if t.dtype not in _ST_DTYPES:
            raise DumpError(f"{path}: tensor {name!r} at byte {sf.abs_offset(t)}: dtype {t.dtype} is not supported "
                            f"for activations (one of {', '.join(_ST_DTYPES)})")
        budget.charge(f"{path}: tensor {name!r} at byte {sf.abs_offset(t)} of shape {list(t.shape)}", math.prod(t.shape),
                      transient=0 if t.dtype == "F32" else t.end - t.begin)  # (F32: read as is, no copy)
        try:
            raw = sf.read_numpy(name)
        except (ValueError, OSError) as e:
            raise DumpError(f"{path}: {e}") from None
        out[name] = bf16_to_f32(raw) if t.dtype == "BF16" else np.asarray(raw, dtype=np.float32)
    meta = sf.metadata or {}
    return out, {str(k): str(v) for k, v in meta.items()}


def read_npz(path: str | os.PathLike, budget: ReadBudget | int | None = None) -> dict[str, np.ndarray]:
    """An ``.npz`` archive's arrays (members named ``NAME.npy`` are read as ``NAME``), read
    member by member with zipfile: each header's claim checked against the member's size and
    the budget before its array is made."""
    path = Path(path)
    budget = ReadBudget.of(budget)
    out: dict[str, np.ndarray] = {}
    try:
        f = fsio.open_regular(path)
    except fsio.InputFileError as e:
        raise DumpError(str(e)) from None
    with f:
        try:
            magic = f.read(6)
            if magic == b"\x93NUMPY":
                raise DumpError(f"{path}: not an .npz archive (it holds a single array; save it as .npy in a directory)")
            f.seek(0)
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            if isinstance(e, DumpError):
                raise
            raise DumpError(f"{path}: not a readable .npz archive ({e})") from None
        with zf:
            for info in zf.infolist():  # (numpy's NpzFile looked each name up in a list: quadratic)
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                out[name] = _read_member(zf, info, budget, f"{path}: array {name!r}")
    return out


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: ReadBudget, where: str) -> np.ndarray:
    """One archive member's array: its header's claim checked against the member's size and
    the budget (:func:`_check_claim`, :meth:`ReadBudget.charge`) before numpy allocates it."""
    unzip_errors = (OSError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError)
    try:
        with zf.open(info) as m:
            shape, dtype, header_end = _npy_header(m)
    except (ValueError, *unzip_errors) as e:
        raise DumpError(f"{where}: not a readable .npy member ({e})") from None
    raw = _check_claim(shape, dtype, info.file_size - header_end, where, "archive member")
    budget.charge(f"{where} of shape {list(shape)}", math.prod(shape), transient=_copied(dtype, raw))
    try:
        with zf.open(info) as m:
            arr = np.lib.format.read_array(m, allow_pickle=False)
    except ValueError as e:  # object arrays need pickle: refused
        raise DumpError(f"{where} cannot be read without pickle ({e}); save numeric arrays only") from None
    except unzip_errors as e:
        raise DumpError(f"{where}: not a readable .npy member ({e})") from None
    return _to_f32(arr, where)


def _npy_header(f) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, the header's end) of the .npy file open at ``f``'s start; ValueError if none."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unknown .npy version {version}")
    return shape, dtype, f.tell()


def _check_claim(shape, dtype: np.dtype, held: int, where: str, holder: str) -> int:
    """The bytes a header claims, refused (before numpy allocates anything) past ``held``:
    ``np.load`` would otherwise allocate the claimed size (element count exact: Python ints)."""
    claimed = math.prod(int(d) for d in shape) * dtype.itemsize
    if claimed > held:
        raise DumpError(f"{where} claims shape {list(shape)} {dtype} ({claimed} bytes) but its {holder} holds "
                        f"{max(held, 0)} bytes")
    return claimed


def _copied(dtype: np.dtype, raw: int) -> int:
    """Bytes of raw data held only while an array is made float32: none when it already is."""
    return 0 if dtype == np.dtype(np.float32) else raw


def read_npy_dir(path: str | os.PathLike, budget: ReadBudget | int | None = None) -> dict[str, np.ndarray]:
    path = Path(path)
    budget = ReadBudget.of(budget)
    files = sorted(p for p in path.rglob("*.npy") if p.is_file())
    if not files:
        raise DumpError(f"{path}: directory holds no .npy files")
    out: dict[str, np.ndarray] = {}
    for p in files:
        name = p.relative_to(path).with_suffix("").as_posix()
        try:
            f = fsio.open_regular(p)
        except fsio.InputFileError as e:
            raise DumpError(str(e)) from None
        with f:
            try:
                shape, dtype, header_end = _npy_header(f)
            except (ValueError, OSError, EOFError) as e:
                raise DumpError(f"{p}: not a readable .npy file ({e})") from None
            raw = _check_claim(shape, dtype, os.fstat(f.fileno()).st_size - header_end, str(p), "file")
            budget.charge(f"{p}: shape {list(shape)}", math.prod(shape), transient=_copied(dtype, raw))
            f.seek(0)
            try:
                arr = np.lib.format.read_array(f, allow_pickle=False)
            except ValueError as e:
                raise DumpError(f"{p}: cannot be read without pickle or is not an .npy file ({e})") from None
            except (OSError, EOFError) as e:
                raise DumpError(f"{p}: not a readable .npy file ({e})") from None
        out[name] = _to_f32(arr, str(p))
    return out


def read_dump(path: str | os.PathLike, budget: ReadBudget | int | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Any supported dump -> (float32 arrays by name, metadata; empty unless safetensors).
    ``budget``: bytes its arrays may take (default: :func:`read_budget`)."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if p.is_dir():
        return read_npy_dir(p, budget), {}
    try:
        with fsio.open_regular(p) as f:  # (a FIFO or device is refused by name, without blocking)
            magic = f.read(4)
    except fsio.InputFileError as e:
        raise DumpError(str(e)) from None
    if p.suffix == ".npz" or magic == b"PK\x03\x04":
        return read_npz(p, budget), {}
    if p.suffix == ".npy" or magic == b"\x93NUM":
        raise DumpError(f"{p}: a single .npy file has no tensor names; put one .npy per op in a directory, "
                        "or use .npz / .safetensors")
    return read_safetensors(p, budget=budget)


def write_dump(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], order: list[str],
               metadata: Mapping[str, str] | None = None) -> None:
    """Write float32 arrays as safetensors, with the op order and provenance in the metadata."""
    from safetensors.numpy import save_file

    meta = {META_FORMAT: FORMAT, META_ORDER: json.dumps(list(order))}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    tensors = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()}
    fsio.write_with(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def write_dump_streaming(path: str | os.PathLike, shapes: Mapping[str, tuple], order: list[str],
                         metadata: Mapping[str, str] | None, produce) -> int:
    """Write float32 tensors one at a time: ``shapes`` (name -> shape, in file order) fixes the
    header up front, ``produce(name)`` returns each array when its turn comes, so only one
    tensor needs to be in memory.  Returns the file size."""
    meta = {META_FORMAT: FORMAT, META_ORDER: json.dumps(list(order))}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    header: dict = {"__metadata__": meta}
    off = 0
    for name, shape in shapes.items():
        n = math.prod(int(x) for x in shape) * 4
        header[name] = {"dtype": "F32", "shape": [int(x) for x in shape], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes
    need = 8 + len(raw) + off
    free = fsio.free_bytes(os.path.dirname(os.path.abspath(path)))
    if free is not None and free < need:
        raise fsio.WriteError(f"{path}: the dump needs {need / 1e6:.1f} MB but its disk has {free / 1e6:.1f} MB free")
    # an exclusive temporary next to the file, renamed into place when whole (removed on failure and SIGTERM)
    with fsio.atomic_write(path) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in shapes.items():
            arr = np.ascontiguousarray(np.asarray(produce(name), dtype=np.float32))
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"tensor {name!r}: produced shape {list(arr.shape)}, header says {list(shape)}")
            f.write(arr.tobytes())
    return need


def dump_order(meta: Mapping[str, str]) -> list[str] | None:
    """The op order recorded in a reference dump's metadata, or None."""
    raw = meta.get(META_ORDER)
    if raw is None:
        return None
    try:
        order = json.loads(raw)
    except json.JSONDecodeError:
        raise DumpError(f"metadata {META_ORDER} is not JSON") from None
    if not isinstance(order, list) or not all(isinstance(x, str) for x in order):
        raise DumpError(f"metadata {META_ORDER} is not a list of op names")
    return order
