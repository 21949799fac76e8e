"""Reading engine dumps and writing reference dumps.

An engine dump is one of:

* a ``.safetensors`` file (any of F64/F32/F16/BF16 and the integer/bool dtypes);
* a ``.npz`` archive, read with ``np.load(allow_pickle=False)`` (object arrays are refused);
* a directory of ``.npy`` files (searched recursively; a file's name, relative to the
  directory, without ``.npy`` and with ``/`` kept, is the tensor name).

Every tensor is returned as a float32 ``numpy`` array keyed by its name in the dump.  The
file is never modified.  Anything unreadable raises :class:`DumpError` naming the file,
the tensor and, for safetensors, the byte offset.

bfloat16 has no numpy dtype: in safetensors it is ``BF16``; in ``.npy``/``.npz`` files
written through ``ml_dtypes`` it appears as the 2-byte void dtype ``V2`` and is read as
bfloat16 too.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from workbench import fsio

#: metadata keys of a reference dump written by :func:`write_dump`
META_FORMAT = "workbench.format"
META_ORDER = "workbench.op_order"
META_IDS = "workbench.ids"
META_MODEL = "workbench.model"
META_DTYPE = "workbench.dtype"
FORMAT = "workbench.dump/1"


class DumpError(ValueError):
    """An engine or reference dump that cannot be read (unusable input)."""


_ST_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # decoded below
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16 or 2-byte void) -> float32, exactly."""
    u = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16
    return u.view(np.float32)


def _to_f32(arr: np.ndarray, where: str) -> np.ndarray:
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
        return bf16_to_f32(arr)
    if arr.dtype.kind not in "fiub":
        raise DumpError(f"{where}: dtype {arr.dtype} is not numeric")
    return np.asarray(arr, dtype=np.float32)


def read_safetensors(path: str | os.PathLike, names: Iterable[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file (only ``names`` if given) -> (float32 arrays, metadata).

    Parsing is the checkpoint reader's defensive one (:class:`SafetensorsFile`: header cap,
    offsets against dtype x shape, neighbours and file size); its first error is raised.
    """
    from workbench.checkpoint.sfile import SafetensorsFile

    path = Path(path)
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
        try:
            raw = sf.read_numpy(name)
        except (ValueError, OSError) as e:
            raise DumpError(f"{path}: {e}") from None
        out[name] = bf16_to_f32(raw) if t.dtype == "BF16" else np.asarray(raw, dtype=np.float32)
    meta = sf.metadata or {}
    return out, {str(k): str(v) for k, v in meta.items()}


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(path)
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise DumpError(f"{path}: not an .npz archive (it holds a single array; save it as .npy in a directory)")
            for name in z.files:
                _check_npz_member(z.zip, name, path)
                try:
                    arr = z[name]
                except ValueError as e:  # object arrays need pickle: refused
                    raise DumpError(f"{path}: array {name!r} cannot be read without pickle ({e}); "
                                    "save numeric arrays only") from None
                out[name] = _to_f32(arr, f"{path}: array {name!r}")
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DumpError(f"{path}: not a readable .npz archive ({e})") from None
    except ValueError as e:
        if isinstance(e, DumpError):
            raise
        raise DumpError(f"{path}: not a readable .npz archive ({e})") from None
    return out


def _check_npz_member(zf: zipfile.ZipFile, name: str, path) -> None:
    """Refuse (before numpy allocates anything) a member whose header claims more elements
    than the member holds: ``np.load`` would otherwise allocate the claimed size."""
    member = name if name in zf.namelist() else name + ".npy"
    try:
        info = zf.getinfo(member)
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unknown .npy version {version}")
            header_end = f.tell()
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError) as e:
        raise DumpError(f"{path}: array {name!r}: not a readable .npy member ({e})") from None
    count = 1
    for d in shape:
        count *= int(d)
    claimed = count * dtype.itemsize
    held = info.file_size - header_end
    if claimed > held:
        raise DumpError(f"{path}: array {name!r} claims shape {list(shape)} {dtype} ({claimed} bytes) but its "
                        f"archive member holds {max(held, 0)} bytes")


def read_npy_dir(path: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(path)
    files = sorted(p for p in path.rglob("*.npy") if p.is_file())
    if not files:
        raise DumpError(f"{path}: directory holds no .npy files")
    out: dict[str, np.ndarray] = {}
    for p in files:
        name = p.relative_to(path).with_suffix("").as_posix()
        try:
            arr = np.load(p, allow_pickle=False)
        except ValueError as e:
            raise DumpError(f"{p}: cannot be read without pickle or is not an .npy file ({e})") from None
        except (OSError, EOFError) as e:
            raise DumpError(f"{p}: not a readable .npy file ({e})") from None
        out[name] = _to_f32(arr, str(p))
    return out


def read_dump(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Any supported dump -> (float32 arrays by name, metadata; empty unless safetensors)."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if p.is_dir():
        return read_npy_dir(p), {}
    try:
        with fsio.open_regular(p) as f:  # (a FIFO or device is refused by name, without blocking)
            magic = f.read(4)
    except fsio.InputFileError as e:
        raise DumpError(str(e)) from None
    if p.suffix == ".npz" or magic == b"PK\x03\x04":
        return read_npz(p), {}
    if p.suffix == ".npy" or magic == b"\x93NUM":
        raise DumpError(f"{p}: a single .npy file has no tensor names; put one .npy per op in a directory, "
                        "or use .npz / .safetensors")
    return read_safetensors(p)


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
        n = int(np.prod(shape, dtype=np.int64)) * 4
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
