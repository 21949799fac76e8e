"""Moving named arrays and JSON between ranks with ``mx.distributed``.

A *bundle* (named arrays plus a small JSON header) goes from one rank to another as three
point-to-point messages: the header's length (8 bytes), the header (names, dtypes,
shapes, byte offsets, and whatever the sender adds), and every array's bytes packed into
one uint8 buffer.  The receiver learns every shape from the header, so nothing has to be
known in advance.  :func:`gather_bytes` collects one byte string from every rank (two
``all_gather``\\ s: the lengths, then the bytes padded to the longest).
"""
from __future__ import annotations

import json
import math
import os

import mlx.core as mx
import numpy as np

from workbench.dtypes import dtype_name


class WireError(RuntimeError):
    """A message between ranks was not what this rank expected (named in the message)."""


def _dtype(name: str) -> mx.Dtype:
    d = mx.bool_ if name == "bool" else getattr(mx, name, None)
    if not isinstance(d, mx.Dtype):
        raise WireError(f"unknown dtype {name!r} in a message from another rank")
    return d


def _bytes_array(data: bytes) -> mx.array:
    return mx.array(np.frombuffer(data, dtype=np.uint8))


def _lost(peer: int, group, e: Exception) -> WireError:
    return WireError(f"rank {group.rank()}: lost the connection to rank {peer} (it stopped; its own message "
                     f"says why): {str(e).strip() or type(e).__name__}")


def _send(x: mx.array, dst: int, group) -> None:
    try:
        mx.eval(mx.distributed.send(x, dst, group=group))
    except RuntimeError as e:
        raise _lost(dst, group, e) from None


def _recv(shape, dtype, src: int, group) -> mx.array:
    try:
        x = mx.distributed.recv(shape, dtype, src, group=group)
        mx.eval(x)
    except RuntimeError as e:
        raise _lost(src, group, e) from None
    return x


def send_bundle(values: dict, meta: dict, dst: int, group) -> int:
    """Send ``values`` (name -> mx.array) and ``meta`` (JSON-able) to rank ``dst``;
    returns the payload's size in bytes."""
    entries, parts, offset = [], [], 0
    for name, v in values.items():
        flat = v.reshape(-1).view(mx.uint8) if v.size else mx.zeros((0,), mx.uint8)
        entries.append({"name": name, "dtype": dtype_name(v.dtype), "shape": list(v.shape),
                        "offset": offset, "nbytes": int(v.nbytes)})
        parts.append(flat)
        offset += int(v.nbytes)
    header = json.dumps({"meta": meta, "arrays": entries, "payload": offset}).encode()
    _send(_bytes_array(len(header).to_bytes(8, "little")), dst, group)
    _send(_bytes_array(header), dst, group)
    if offset:
        _send(mx.concatenate(parts) if len(parts) > 1 else parts[0], dst, group)
    return offset


#: the largest bundle header a rank accepts (names, dtypes, shapes and a small meta)
MAX_HEADER = 64 * 2**20


def _memory_bytes() -> int:
    """This machine's physical memory: no payload can be larger (2**40 where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 2**40


def _checked_entries(header, src: int) -> tuple[list[tuple], int]:
    """The header's arrays as (name, dtype, shape, offset, nbytes) and the payload size,
    every field checked (each array's bytes are its shape's, inside the payload, and the
    payload fits this machine's memory) before anything is allocated for them."""
    def bad(why):
        return WireError(f"rank {src} sent an unreadable header ({why})")

    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list) or "meta" not in header:
        raise bad("not a workbench bundle")
    total = header.get("payload")
    if not isinstance(total, int) or not 0 <= total <= _memory_bytes():
        raise bad(f"payload of {total!r} bytes")
    out = []
    for e in header["arrays"]:
        try:
            name, dt, shape = e["name"], _dtype(e["dtype"]), tuple(e["shape"])
            offset, nbytes = e["offset"], e["nbytes"]
        except (KeyError, TypeError):
            raise bad(f"array entry {e!r}") from None
        ints = (offset, nbytes) + shape
        if not isinstance(name, str) or not all(isinstance(i, int) and i >= 0 for i in ints) \
                or nbytes != math.prod(shape) * dt.size or offset + nbytes > total:
            raise bad(f"array entry {e!r} does not match a {total}-byte payload")
        out.append((name, dt, shape, offset, nbytes))
    return out, total


def recv_bundle(src: int, group) -> tuple[dict, dict]:
    """(meta, values) of the bundle rank ``src`` sends with :func:`send_bundle`."""
    n = int.from_bytes(bytes(np.array(_recv((8,), mx.uint8, src, group))), "little")
    if not 0 < n <= MAX_HEADER:
        raise WireError(f"rank {src} sent a header length of {n} bytes: not a workbench bundle")
    try:
        header = json.loads(bytes(np.array(_recv((n,), mx.uint8, src, group))))
    except ValueError as e:
        raise WireError(f"rank {src} sent an unreadable header ({e})") from None
    entries, total = _checked_entries(header, src)
    payload = _recv((total,), mx.uint8, src, group) if total else None
    values = {}
    for name, dt, shape, offset, nbytes in entries:
        values[name] = mx.zeros(shape, dt) if nbytes == 0 else payload[offset: offset + nbytes].view(dt).reshape(shape)
    return header["meta"], values


def gather_bytes(data: bytes, group) -> list[bytes]:
    """Every rank's ``data``, in rank order (on every rank)."""
    size = group.size()
    if size == 1:
        return [data]
    try:
        lengths = mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int64), group=group)
        lengths = [int(n) for n in np.array(lengths).reshape(-1)]
    except RuntimeError as e:
        raise WireError(f"rank {group.rank()}: gathering from every rank failed (a rank stopped; its own "
                        f"message says why): {str(e).strip() or type(e).__name__}") from None
    if len(lengths) != size or any(not 0 <= n < 2**31 for n in lengths):
        raise WireError(f"the ranks' message lengths {lengths} are not what {size} ranks send: "
                        "a rank failed or runs another program")
    longest = max(lengths)
    padded = data + bytes(longest - len(data))
    try:
        got = np.array(mx.distributed.all_gather(_bytes_array(padded), group=group)).reshape(size, longest)
    except RuntimeError as e:
        raise WireError(f"rank {group.rank()}: gathering from every rank failed: {str(e).strip()}") from None
    return [bytes(got[r, : lengths[r]]) for r in range(size)]
