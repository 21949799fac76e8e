"""Streaming value statistics: bounded memory, per-element counts.

Every tensor is read sequentially in chunks (``chunk_bytes``); quantized weights are
dequantized group by group (rows of the packed weight with the matching rows of scales
and biases).  Per tensor: min, max, mean, std, absmax, NaN / +Inf / -Inf counts and the
zero fraction.  NaN and Inf counts are counted element by element; min / max / mean /
std cover the finite elements.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import queue

import numpy as np

from workbench.checkpoint.sfile import DTYPE_BITS
from workbench.checkpoint.values_native import Acc, native, new_acc
from workbench.dtypes import bf16_to_f32
from workbench.stats_schema import row

READAHEAD = 0  # bytes to prefetch with POSIX_FADV_WILLNEED ahead of the reader (0: none; the kernel's
#               sequential read-ahead, POSIX_FADV_SEQUENTIAL, measured faster on a VM disk)
CHUNK_BYTES = 4 << 20  # read size; statistics run on cache-sized pieces of it

_BF16 = {"BF16"}
_INT = {"U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
        "I32": np.int32, "U64": np.uint64, "I64": np.int64, "BOOL": np.bool_}
_FLT = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


class Stats:
    """Running statistics of one tensor; partial results of chunks merge exactly
    (counts) or to float64 precision (Chan's parallel mean / M2)."""

    __slots__ = ("n", "nan", "posinf", "neginf", "zeros", "min", "max", "mean", "m2", "finite")

    def __init__(self):
        self.n = self.nan = self.posinf = self.neginf = self.zeros = self.finite = 0
        self.min = math.inf
        self.max = -math.inf
        self.mean = 0.0
        self.m2 = 0.0

    def add(self, x: np.ndarray, scratch: np.ndarray | None = None):
        """x: 1-D array (float32 for float data). ``scratch``: a bool buffer >= x.size."""
        n = x.size
        if n == 0:
            return
        if x.dtype == np.float32 and n < (1 << 31):
            lib = native()
            if lib is not None:
                x = np.ascontiguousarray(x)
                a = new_acc()
                lib.wb_f32(x.ctypes.data, n, ctypes.byref(a))
                _absorb(self, a)
                return
        self.n += n
        b = scratch[:n] if scratch is not None and scratch.size >= n else np.empty(n, np.bool_)
        if x.dtype.kind == "f":
            np.isfinite(x, out=b)
            fin = int(np.count_nonzero(b))
            if fin != n:  # count every non-finite element by kind
                nan = int(np.count_nonzero(np.isnan(x)))
                pinf = int(np.count_nonzero(x == np.inf))
                self.nan += nan
                self.posinf += pinf
                self.neginf += n - fin - nan - pinf
                x = x[b]
                m = x.size
                if m == 0:
                    return
                b = b[:m]
            else:
                m = n
            np.equal(x, 0, out=b)
            self.zeros += int(np.count_nonzero(b))
        else:
            m = n
            self.zeros += m - int(np.count_nonzero(x))
        lo, hi = np.minimum.reduce(x), np.maximum.reduce(x)
        self.min = min(self.min, float(lo))
        self.max = max(self.max, float(hi))
        if x.dtype == np.float32:
            self._moments(x, m)
            return
        else:
            xf = x.astype(np.float64)
            mu = float(xf.mean())
            m2 = float(((xf - mu) ** 2).sum())
        self._merge(m, mu, m2)

    def add_bf16(self, u: np.ndarray, f32buf: np.ndarray | None = None, u16buf: np.ndarray | None = None):
        """BF16 bits (uint16). Fast path with fewer passes: special values (zero, NaN/Inf) and
        min / max are found on the 16-bit patterns; every element is still examined, and any
        NaN/Inf sends the chunk through the exact per-kind counting of ``add``."""
        n = u.size
        if n == 0:
            return
        lib = native()
        if lib is not None:
            u = np.ascontiguousarray(u, np.uint16)
            a = new_acc()
            lib.wb_bf16(u.ctypes.data, n, ctypes.byref(a))
            _absorb(self, a)
            return
        v = u16buf[:n] if u16buf is not None and u16buf.size >= n else np.empty(n, np.uint16)
        np.bitwise_and(u, 0x7FFF, out=v)  # magnitude bits
        if int(np.maximum.reduce(v)) >= 0x7F80:  # some element is NaN or +-Inf
            self.add(_bf16_to_f32(u, f32buf))
            return
        zeros = n - int(np.count_nonzero(v)) if int(np.minimum.reduce(v)) == 0 else 0
        i16 = u.view(np.int16)
        imax, umax = int(np.maximum.reduce(i16)), int(np.maximum.reduce(u))
        hi = imax if imax >= 0 else int(np.minimum.reduce(i16)) & 0xFFFF  # all negative: smallest magnitude
        lo = umax if umax >= 0x8000 else int(np.minimum.reduce(u))  # any negative: largest magnitude
        x = _bf16_to_f32(u, f32buf)
        self.n += n
        self.zeros += zeros
        self.min = min(self.min, _bf16_value(lo))
        self.max = max(self.max, _bf16_value(hi))
        self._moments(x, n)

    def _moments(self, x, m):
        s = float(np.add.reduce(x, dtype=np.float64))  # (fallback path) the mean to float64 precision
        ss = float(np.dot(x, x))
        mu = s / m
        m2 = ss - s * mu
        if m2 < 1e-3 * ss or m2 <= 0:  # cancellation (values far from 0) or underflow (tiny values): centre first
            d = x.astype(np.float64) - mu
            m2 = float(np.dot(d, d))
        self._merge(m, mu, m2)

    def _merge(self, m, mu, m2):
        if self.finite == 0:
            self.mean, self.m2 = mu, m2
        else:
            tot = self.finite + m
            delta = mu - self.mean
            self.mean += delta * m / tot
            self.m2 += m2 + delta * delta * self.finite * m / tot
        self.finite += m

    def merge(self, o: "Stats"):
        self.n += o.n
        self.nan += o.nan
        self.posinf += o.posinf
        self.neginf += o.neginf
        self.zeros += o.zeros
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)
        if o.finite:
            self._merge(o.finite, o.mean, o.m2)

    def to_dict(self) -> dict:
        fin = self.finite
        return row(fin > 0, self.min, self.max, self.mean, math.sqrt(max(self.m2, 0.0) / fin) if fin else None,
                   max(abs(self.min), abs(self.max)), self.nan, self.posinf, self.neginf,
                   (self.zeros / self.n) if self.n else 0.0, count=self.n)


def _bf16_value(bits: int) -> float:
    return float(bf16_to_f32(np.array([bits], np.uint16))[0])


_ONES = np.ones(0, np.float32)


def _ones(n):
    global _ONES
    if _ONES.size < n:
        _ONES = np.ones(max(n, 1 << 17), np.float32)
    return _ONES[:n]


def _bf16_to_f32(u: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if out is None or out.size < u.size:
        out = np.empty(u.size, np.uint32)
    return bf16_to_f32(u, out[: u.size])


def _lut_e8m0() -> np.ndarray:
    """MX scales (E8M0: a biased power of two) -> float32; 255 is NaN."""
    x = np.ldexp(np.float64(1), np.arange(256) - 127)
    x[255] = np.nan
    x = x.astype(np.float32)
    return x


def _fp8_fields(e_bits: int, m_bits: int):
    """Every 8-bit float pattern: (exponent field, mantissa field, value in float64 with the
    all-ones exponent still read as a normal number)."""
    u = np.arange(256)
    bias = (1 << (e_bits - 1)) - 1
    sign = np.where(u & 0x80, -1.0, 1.0)
    e = (u >> m_bits) & ((1 << e_bits) - 1)
    m = u & ((1 << m_bits) - 1)
    step = float(1 << m_bits)
    v = np.where(e == 0, m / step * 2.0 ** (1 - bias), (1 + m / step) * 2.0 ** (e - float(bias))) * sign
    return u, e, m, v


def _lut_e4m3() -> np.ndarray:
    """FP8 E4M3 (nvfp4 scales) -> float32; S.1111.111 is NaN, no infinities."""
    u, _, _, v = _fp8_fields(4, 3)
    v = v.astype(np.float32)
    v[(u & 0x7F) == 0x7F] = np.nan
    return v


def _lut_e5m2() -> np.ndarray:
    """FP8 E5M2 -> float32 (IEEE-like: exponent 31 is Inf / NaN)."""
    u, e, m, v = _fp8_fields(5, 2)
    v[(e == 31) & (m == 0)] = np.inf
    v[(e == 31) & (m == 0) & (u & 0x80 > 0)] = -np.inf
    v[(e == 31) & (m != 0)] = np.nan
    return v.astype(np.float32)


LUT = {"E8M0": _lut_e8m0(), "E4M3": _lut_e4m3(), "E5M2": _lut_e5m2()}


def to_float(raw: bytes | memoryview, dtype: str, scratch=None) -> np.ndarray:
    if dtype in _BF16:
        return _bf16_to_f32(np.frombuffer(raw, np.uint16), scratch)
    if dtype in _FLT:
        a = np.frombuffer(raw, _FLT[dtype])
        return a if dtype != "F16" else a.astype(np.float32)
    if dtype in ("F8_E8M0", "E8M0"):
        return LUT["E8M0"][np.frombuffer(raw, np.uint8)]
    if dtype in ("F8_E4M3", "E4M3"):
        return LUT["E4M3"][np.frombuffer(raw, np.uint8)]
    if dtype in ("F8_E5M2", "E5M2"):
        return LUT["E5M2"][np.frombuffer(raw, np.uint8)]
    if dtype in _INT:
        return np.frombuffer(raw, _INT[dtype])
    raise ValueError(f"dtype {dtype} not supported by --values")


class ChunkReader:
    """Sequential chunked reads of byte ranges of one file, prefetched by a thread
    (numpy releases the GIL, so reading and statistics overlap)."""

    def __init__(self, path: str, chunk: int = CHUNK_BYTES, depth: int = 4, nbuf: int = 16, pool: list | None = None):
        """``pool``: a list shared by the readers of one scan; a reader takes its buffers from it and
        leaves them there when done, so the next file's reader reuses them (no fresh pages to
        zero and fault in for every file)."""
        self.path, self.chunk, self.depth, self.nbuf = path, chunk, depth, max(nbuf, depth + 2)
        self.free: queue.Queue = queue.Queue()  # recycled buffers: no fresh pages to fault in per chunk
        self.made = 0
        self.pool = pool
        self.closed = False

    def release(self, buf):
        """Hand a buffer yielded by ``ranges`` back once its bytes are used."""
        if buf is None:
            return
        if self.closed and self.pool is not None:
            self.pool.append(buf)  # list.append is atomic under the GIL
        else:
            self.free.put(buf)

    def _close(self):
        self.closed = True
        if self.pool is not None:
            while True:
                try:
                    self.pool.append(self.free.get_nowait())
                except queue.Empty:
                    return

    def _buffer(self, stop):
        while True:
            try:
                return self.free.get_nowait()
            except queue.Empty:
                if self.made < self.nbuf:
                    self.made += 1
                    if self.pool:
                        try:
                            b = self.pool.pop()
                            if len(b) == self.chunk:
                                return b
                        except IndexError:
                            pass
                    return bytearray(self.chunk)
            try:
                return self.free.get(timeout=0.05)
            except queue.Empty:
                if stop.is_set():
                    return None

    def ranges(self, spans):
        """spans: list of (key, start, length) in file order -> yields (key, buffer, nbytes)
        chunks (give each buffer back with ``release``), then (key, None, 0) at the end of
        each span."""
        q: queue.Queue = queue.Queue(self.depth)
        stop = threading.Event()

        def work():
            try:
                with open(self.path, "rb", buffering=0) as f:
                    ahead = 0  # the kernel reads this far ahead asynchronously (posix_fadvise WILLNEED)
                    advise = getattr(os, "posix_fadvise", None)
                    if advise:
                        try:
                            advise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                        except OSError:
                            advise = None
                    if not READAHEAD:
                        advise = None
                    for key, start, length in spans:
                        f.seek(start)
                        left = length
                        while left > 0 and not stop.is_set():
                            pos = start + length - left
                            if advise and pos + READAHEAD // 2 > ahead:
                                try:
                                    advise(f.fileno(), max(pos, ahead), pos + READAHEAD - max(pos, ahead),
                                           os.POSIX_FADV_WILLNEED)
                                except OSError:
                                    pass
                                ahead = pos + READAHEAD
                            buf = self._buffer(stop)
                            if buf is None:
                                break
                            n = f.readinto(memoryview(buf)[: min(self.chunk, left)])
                            if not n:
                                raise EOFError(f"unexpected end of file at byte {start + length - left}")
                            left -= n
                            q.put((key, buf, n))
                        q.put((key, None, 0))
                q.put(StopIteration)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                q.put(e)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is StopIteration:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while t.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    t.join(0.01)
            self._close()


def pread(path: str, offset: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


def dequant_rows(wbytes: bytes, sbytes: bytes, bbytes: bytes | None, rows: int, packed: int, ngroups: int,
                 spec, sdtype: str) -> np.ndarray:
    """Dequantize ``rows`` rows of a packed weight (groups along the last axis)."""
    import mlx.core as mx

    w = mx.array(np.frombuffer(wbytes, np.uint32).reshape(rows, packed))
    if sdtype == "U8":
        s = mx.array(np.frombuffer(sbytes, np.uint8).reshape(rows, ngroups))
        out = mx.dequantize(w, s, None, group_size=spec.group_size, bits=spec.bits, mode=spec.mode)
    else:
        def fl(b):  # scales / biases in their own dtype, as the reference dequantizes them
            if sdtype == "BF16":
                return mx.array(np.frombuffer(b, np.uint16).reshape(rows, ngroups)).view(mx.bfloat16)
            return mx.array(np.ascontiguousarray(to_float(b, sdtype)).reshape(rows, ngroups))
        out = mx.dequantize(w, fl(sbytes), fl(bbytes) if bbytes is not None else None,
                            group_size=spec.group_size, bits=spec.bits, mode="affine")
    if out.dtype == mx.bfloat16:  # BF16 bits: statistics take the fast 16-bit path
        return np.array(out.view(mx.uint16)).reshape(-1)
    return np.array(out.astype(mx.float32)).reshape(-1)


def row_bytes(dtype: str, shape) -> int:
    return (shape[-1] * DTYPE_BITS[dtype] + 7) // 8 if shape else (DTYPE_BITS[dtype] + 7) // 8


def _absorb(st: "Stats", a: Acc):
    st.n += a.n
    st.nan += a.nan
    st.posinf += a.posinf
    st.neginf += a.neginf
    st.zeros += a.zeros
    m = a.n - a.nan - a.posinf - a.neginf
    if m:
        st.min = min(st.min, a.min)
        st.max = max(st.max, a.max)
        st._merge(m, a.k + a.s1 / m, max(a.s2 - a.s1 * a.s1 / m, 0.0))


_SDT = {"F32": 0, "BF16": 1, "F16": 2}


def affine_stats(wbytes, sbytes, bbytes, rows: int, packed: int, spec, sdtype: str) -> "Stats | None":
    """Statistics of ``rows`` rows of an affine-quantized weight, dequantized element by element
    exactly as ``mx.dequantize`` does (in the scales' dtype), in one native pass; None when the
    native kernels are unavailable or the layout is not one they handle (the caller then
    dequantizes with MLX)."""
    lib = native()
    if lib is None or spec.mode != "affine" or sdtype not in _SDT or bbytes is None:
        return None
    w = np.frombuffer(wbytes, np.uint32)
    sc = np.frombuffer(sbytes, np.uint8)
    bi = np.frombuffer(bbytes, np.uint8)
    per_row = packed * 32 // spec.bits // spec.group_size if spec.bits and spec.group_size else 0
    want = rows * per_row * (4 if sdtype == "F32" else 2)  # scales / biases bytes the kernel will read
    if w.size != rows * packed or per_row <= 0 or sc.size != want or bi.size != want:
        return None  # (short reads, odd layouts) the caller's checked path reports it
    a = new_acc()
    if lib.wb_affine(w.ctypes.data, sc.ctypes.data, bi.ctypes.data, _SDT[sdtype], rows, packed, spec.bits,
                     spec.group_size, ctypes.byref(a)) != 0:
        return None
    st = Stats()
    _absorb(st, a)
    return st
