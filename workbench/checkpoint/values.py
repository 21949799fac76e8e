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
                a = _new_acc()
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
            a = _new_acc()
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
        return {
            "min": self.min if fin else None, "max": self.max if fin else None,
            "mean": self.mean if fin else None, "std": math.sqrt(max(self.m2, 0.0) / fin) if fin else None,
            "absmax": max(abs(self.min), abs(self.max)) if fin else None,
            "nan": self.nan, "posinf": self.posinf, "neginf": self.neginf,
            "zero_fraction": (self.zeros / self.n) if self.n else 0.0, "count": self.n,
        }


def _bf16_value(bits: int) -> float:
    return float(np.array([bits << 16], np.uint32).view(np.float32)[0])


_ONES = np.ones(0, np.float32)


def _ones(n):
    global _ONES
    if _ONES.size < n:
        _ONES = np.ones(max(n, 1 << 17), np.float32)
    return _ONES[:n]


def _bf16_to_f32(u: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if out is None or out.size < u.size:
        out = np.empty(u.size, np.uint32)
    o = out[: u.size]
    np.left_shift(u, 16, out=o, dtype=np.uint32)
    return o.view(np.float32)


def _lut_e8m0() -> np.ndarray:
    """MX scales (E8M0: a biased power of two) -> float32; 255 is NaN."""
    x = np.ldexp(np.float64(1), np.arange(256) - 127)
    x[255] = np.nan
    x = x.astype(np.float32)
    return x


def _lut_e4m3() -> np.ndarray:
    """FP8 E4M3 (nvfp4 scales) -> float32; S.1111.111 is NaN, no infinities."""
    u = np.arange(256)
    sign = np.where(u & 0x80, -1.0, 1.0)
    e = (u >> 3) & 0xF
    m = u & 0x7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0)) * sign
    v = v.astype(np.float32)
    v[(u & 0x7F) == 0x7F] = np.nan
    return v


def _lut_e5m2() -> np.ndarray:
    """FP8 E5M2 -> float32 (IEEE-like: exponent 31 is Inf / NaN)."""
    u = np.arange(256)
    sign = np.where(u & 0x80, -1.0, 1.0)
    e = (u >> 2) & 0x1F
    m = u & 0x3
    with np.errstate(over="ignore"):
        v = np.where(e == 0, m / 4.0 * 2.0 ** -14, (1 + m / 4.0) * 2.0 ** (e - 15.0)) * sign
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


# ------------------------------------------------------------------ native kernels
# One fused pass per chunk in C (every element examined: counts by kind, min / max of the
# finite values, shifted sums for mean / std), compiled on first use with the system C
# compiler into a per-user cache and loaded with ctypes (calls release the GIL, so worker
# threads run in parallel).  Without a compiler, or with WORKBENCH_NATIVE=0, the numpy
# code above is used; tests check that both give the same statistics.
NATIVE = os.environ.get("WORKBENCH_NATIVE", "1") != "0"

_C_SRC = r"""

/* workbench --values kernels: one pass per chunk, every element examined. */
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

typedef struct {
    int64_t n, nan, pinf, ninf, zeros, have_k;
    double mn, mx, k, s1, s2;
} wb_acc;

#define L 16
#define BLK 4096
#define TINY 0x1p-40  /* max |x - k| outside [TINY, HUGE]: float sums of squares would under- or */
#define HUGE 0x1p56   /* overflow, so the sums are redone in double */
#define REDO(up, lo, k) (((up) - (k) < TINY && (k) - (lo) < TINY) || (up) - (k) > HUGE || (k) - (lo) > HUGE)

static void one(float v, wb_acc *a) {  /* a single element, scalar */
    uint32_t b; memcpy(&b, &v, 4);
    uint32_t e = b & 0x7FFFFFFFu;
    a->n++;
    if (e > 0x7F800000u) { a->nan++; return; }
    if (b == 0x7F800000u) { a->pinf++; return; }
    if (b == 0xFF800000u) { a->ninf++; return; }
    if (!a->have_k) { a->k = v; a->have_k = 1; }
    a->zeros += e == 0;
    if (v < a->mn) a->mn = v;
    if (v > a->mx) a->mx = v;
    double d = (double)v - a->k;
    a->s1 += d; a->s2 += d * d;
}

/* statistics of n float32 values: NaN / +Inf / -Inf counted by kind and left out of
   min / max / sums; sums are of (x - k), k the first finite value seen (no cancellation) */
static void fstats(const float *x, int64_t n, wb_acc *a) {
    int64_t i = 0;
    while (i < n && !a->have_k) one(x[i++], a);
    if (i >= n) return;
    const float k = (float)a->k;
    const double kd = a->k;
    float mn[L], mx[L];
    double s1[L], s2[L];
    int32_t cn[L], cp[L], cm[L], cz[L];  /* callers pass n < 2^31 */
    for (int j = 0; j < L; j++) { mn[j] = k; mx[j] = k; s1[j] = 0; s2[j] = 0; cn[j] = cp[j] = cm[j] = cz[j] = 0; }
    int64_t body = i + (n - i) / L * L, start = i;
    while (i < body) {
        float f1[L], f2[L];  /* float partial sums over at most 64 elements per lane, then double */
        for (int j = 0; j < L; j++) { f1[j] = 0; f2[j] = 0; }
        int64_t stop = i + 64 * L < body ? i + 64 * L : body;
        for (; i < stop; i += L) {
            for (int j = 0; j < L; j++) {
                float v = x[i + j];
                uint32_t b; memcpy(&b, &v, 4);
                uint32_t e = b & 0x7FFFFFFFu;
                int fin = e < 0x7F800000u;
                cn[j] += e > 0x7F800000u;
                cp[j] += b == 0x7F800000u;
                cm[j] += b == 0xFF800000u;
                cz[j] += e == 0;
                float f = fin ? v : k;
                mn[j] = f < mn[j] ? f : mn[j];
                mx[j] = f > mx[j] ? f : mx[j];
                float d = f - k;
                f1[j] += d;
                f2[j] += d * d;
            }
        }
        for (int j = 0; j < L; j++) { s1[j] += f1[j]; s2[j] += f2[j]; }
    }
    a->n += body - start;
    float lo = k, up = k;
    double t1 = 0, t2 = 0;
    for (int j = 0; j < L; j++) {
        a->nan += cn[j]; a->pinf += cp[j]; a->ninf += cm[j]; a->zeros += cz[j];
        if (mn[j] < lo) lo = mn[j];
        if (mx[j] > up) up = mx[j];
        t1 += s1[j]; t2 += s2[j];
    }
    if (REDO((double)up, (double)lo, kd)) {  /* float squares would under- or overflow: redo in double */
        t1 = t2 = 0;
        for (int64_t j = start; j < body; j++) {
            uint32_t b; memcpy(&b, &x[j], 4);
            if ((b & 0x7FFFFFFFu) < 0x7F800000u) { double d = (double)x[j] - kd; t1 += d; t2 += d * d; }
        }
    }
    if (lo < a->mn) a->mn = lo;
    if (up > a->mx) a->mx = up;
    a->s1 += t1; a->s2 += t2;
    for (; i < n; i++) one(x[i], a);
}

void wb_f32(const float *x, int64_t n, wb_acc *a) {
    for (int64_t i = 0; i < n; i += 1 << 30) fstats(x + i, n - i < (1 << 30) ? n - i : (1 << 30), a);
}

void wb_bf16(const uint16_t *u, int64_t n, wb_acc *a) {
    float t[BLK];
    for (int64_t i = 0; i < n; i += BLK) {
        int64_t m = n - i < BLK ? n - i : BLK;
        for (int64_t j = 0; j < m; j++) { uint32_t b = (uint32_t)u[i + j] << 16; memcpy(&t[j], &b, 4); }
        fstats(t, m, a);
    }
}

static inline float bf16_round(float x) {  /* round to nearest even bfloat16 (NaN stays NaN) */
    uint32_t b; memcpy(&b, &x, 4);
    uint32_t r = ((b & 0x7FFFFFFFu) > 0x7F800000u) ? (b | 0x00400000u) : b + 0x7FFFu + ((b >> 16) & 1u);
    r &= 0xFFFF0000u;
    float y; memcpy(&y, &r, 4);
    return y;
}

#ifdef WB_NO_F16  /* compilers without _Float16: float16 scales are refused (wb_affine returns -1) */
static inline float f16_round(float x) { return x; }
static inline float half_to_float(uint16_t h) { (void)h; return 0.0f; }
#else
static inline float f16_round(float x) { return (float)(_Float16)x; }
static inline float half_to_float(uint16_t h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
#endif

static inline float load_s(const void *p, int64_t i, int sdt) {
    if (sdt == 1) { uint32_t b = (uint32_t)((const uint16_t *)p)[i] << 16; float f; memcpy(&f, &b, 4); return f; }
    if (sdt == 2) return half_to_float(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static inline float deq(float s, float q, float b, int sdt) {
    if (sdt == 1) return bf16_round(bf16_round(s * q) + b);
    if (sdt == 2) return f16_round(f16_round(s * q) + b);
    return s * q + b;
}

/* one group, element by element: levels table, values appended to t (flushed when full) */
static void group_scalar(const uint32_t *p, float s, float b, int sdt, int bits, int64_t gs, float *t,
                         int64_t *fill, wb_acc *a) {
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    const int64_t gw = gs * bits / 32;
    float lv[256];  /* every level's value in this group */
    for (uint32_t q = 0; q <= mask; q++) lv[q] = deq(s, (float)q, b, sdt);
    if (*fill + gs > BLK) { fstats(t, *fill, a); *fill = 0; }
    float *o = t + *fill;
    for (int64_t k = 0; k < gw; k++) {
        uint32_t x = p[k];
        for (int e = 0; e < per; e++) o[k * per + e] = lv[(x >> (e * bits)) & mask];
    }
    *fill += gs;
}

#ifdef __AVX512F__
#include <immintrin.h>
static inline __m512 bf16_round16(__m512 x) {
    __m512i b = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1)));
    __mmask16 nan = _mm512_cmp_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)),
                                          _mm512_set1_epi32(0x7F800000), _MM_CMPINT_NLE);
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline __m512 bf16_round16_finite(__m512 x) {  /* no NaN possible in x */
    __m512i b = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline __m512 f16_round16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* the 16 levels' values of one 4-bit group, as deq computes them */
static inline __m512 levels16(float s, float b, int sdt) {
    const __m512 q = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 sv = _mm512_set1_ps(s), bv = _mm512_set1_ps(b);
    if (sdt == 1 && __builtin_isfinite(s) && __builtin_isfinite(b))  /* then s * q + b is never NaN */
        return bf16_round16_finite(_mm512_add_ps(bf16_round16_finite(_mm512_mul_ps(sv, q)), bv));
    if (sdt == 1) return bf16_round16(_mm512_add_ps(bf16_round16(_mm512_mul_ps(sv, q)), bv));
    if (sdt == 2) return f16_round16(_mm512_add_ps(f16_round16(_mm512_mul_ps(sv, q)), bv));
    return _mm512_add_ps(_mm512_mul_ps(sv, q), bv);
}

/* 4-bit, group size 64 or a multiple of 128: 16 words (128 values) at a time, each value looked up
   in its group's 16-level table with one permute; groups whose table holds a NaN / Inf level go
   element by element instead.  Returns the number of groups done (a prefix). */
static int64_t affine4_avx512(const uint32_t *w, const void *sc, const void *bi, int sdt, int64_t G, int64_t gs,
                              wb_acc *a, float *t, int64_t *fill) {
    if (gs != 64 && gs % 128) return 0;
    const int64_t gw = gs / 8;  /* words per group */
    const int64_t gpb = gs == 64 ? 2 : 1;  /* groups per 16-word block */
    const int64_t bpg = gs == 64 ? 1 : gs / 128;  /* blocks per group */
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512i hi = gs == 64 ? _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0)
                                : _mm512_setzero_si512();
    __m512 mn = _mm512_set1_ps(__builtin_inff()), mx = _mm512_set1_ps(-__builtin_inff());
    __m512d d1a = _mm512_setzero_pd(), d1b = _mm512_setzero_pd(), d2a = _mm512_setzero_pd(), d2b = _mm512_setzero_pd();
    int64_t zeros = 0, nfast = 0;
    __m512i cz = _mm512_setzero_si512(), cz2 = cz;  /* per-lane zero counts, folded into zeros every group */
    __m512 mn2 = mn, mx2 = mx;
    const __m512i one = _mm512_set1_epi32(1);
    double k = 0;
    int64_t g = 0;
    for (; g + gpb <= G; g += gpb) {
        const __m512 ta = levels16(load_s(sc, g, sdt), load_s(bi, g, sdt), sdt);
        const __m512 tb = gpb == 2 ? levels16(load_s(sc, g + 1, sdt), load_s(bi, g + 1, sdt), sdt) : ta;
        const __m512 inf = _mm512_set1_ps(__builtin_inff());
        if ((__mmask16)(_mm512_cmp_ps_mask(_mm512_abs_ps(ta), inf, _CMP_LT_OQ) &
                        _mm512_cmp_ps_mask(_mm512_abs_ps(tb), inf, _CMP_LT_OQ)) != 0xFFFF) {
            /* a NaN / Inf level: count element by element */
            for (int64_t j = 0; j < gpb; j++)
                group_scalar(w + (g + j) * gw, load_s(sc, g + j, sdt), load_s(bi, g + j, sdt), sdt, 4, gs, t, fill, a);
            continue;
        }
        const __m512 z = _mm512_setzero_ps();
        for (int64_t bl = 0; bl < bpg; bl++) {
            const __m512i x = _mm512_loadu_si512((const void *)(w + g * gw + bl * 16));
            __m512 f1 = _mm512_setzero_ps(), f2 = _mm512_setzero_ps(), g1 = f1, g2 = f2;
            for (int e = 0; e < 8; e += 2) {  /* two independent accumulator chains */
                /* (x >> 4e) & 15 | hi in one ternary-logic op */
                __m512i ia = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 4 * e), m15, hi, 0xea);
                __m512i ib = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 4 * e + 4), m15, hi, 0xea);
                __m512 v = _mm512_permutex2var_ps(ta, ia, tb), u = _mm512_permutex2var_ps(ta, ib, tb);
                mn = _mm512_min_ps(mn, v);
                mx = _mm512_max_ps(mx, v);
                mn2 = _mm512_min_ps(mn2, u);
                mx2 = _mm512_max_ps(mx2, u);
                cz = _mm512_mask_add_epi32(cz, _mm512_cmp_ps_mask(v, z, _CMP_EQ_OQ), cz, one);
                cz2 = _mm512_mask_add_epi32(cz2, _mm512_cmp_ps_mask(u, z, _CMP_EQ_OQ), cz2, one);
                f1 = _mm512_add_ps(f1, v);  /* sums unshifted; cancellation is checked below */
                f2 = _mm512_fmadd_ps(v, v, f2);
                g1 = _mm512_add_ps(g1, u);
                g2 = _mm512_fmadd_ps(u, u, g2);
            }
            f1 = _mm512_add_ps(f1, g1);
            f2 = _mm512_add_ps(f2, g2);
            d1a = _mm512_add_pd(d1a, _mm512_cvtps_pd(_mm512_castps512_ps256(f1)));
            d1b = _mm512_add_pd(d1b, _mm512_cvtps_pd(_mm512_extractf32x8_ps(f1, 1)));
            d2a = _mm512_add_pd(d2a, _mm512_cvtps_pd(_mm512_castps512_ps256(f2)));
            d2b = _mm512_add_pd(d2b, _mm512_cvtps_pd(_mm512_extractf32x8_ps(f2, 1)));
        }
        nfast += gpb * gs;
        if ((g & 0xFFFF) == 0) {
            zeros += _mm512_reduce_add_epi32(_mm512_add_epi32(cz, cz2));
            cz = cz2 = _mm512_setzero_si512();
        }
    }
    zeros += _mm512_reduce_add_epi32(_mm512_add_epi32(cz, cz2));
    mn = _mm512_min_ps(mn, mn2);
    mx = _mm512_max_ps(mx, mx2);
    if (nfast) {
        double s1 = _mm512_reduce_add_pd(_mm512_add_pd(d1a, d1b)), s2 = _mm512_reduce_add_pd(_mm512_add_pd(d2a, d2b));
        float lo = _mm512_reduce_min_ps(mn), up = _mm512_reduce_max_ps(mx);
        /* float squares would under- or overflow, or the mean dwarfs the spread (cancellation in
           s2 - s1^2 / n): redo the sums in double, shifted by the mid-range */
        if (REDO((double)up, (double)lo, 0.0) || !(s2 - s1 * s1 / (double)nfast >= 1e-3 * s2)) {
            k = 0.5 * ((double)lo + (double)up);
            float lv[16];
            s1 = s2 = 0;
            for (int64_t h = 0; h < g; h++) {
                _mm512_storeu_ps(lv, levels16(load_s(sc, h, sdt), load_s(bi, h, sdt), sdt));
                int fin = 1;
                for (int q = 0; q < 16; q++) fin &= __builtin_isfinite(lv[q]);
                if (!fin) continue;  /* done element by element above */
                for (int64_t i = 0; i < gw; i++)
                    for (int e = 0; e < 8; e++) {
                        double d = (double)lv[(w[h * gw + i] >> (4 * e)) & 15u] - k;
                        s1 += d; s2 += d * d;
                    }
            }
        }
        /* re-base the shifted sums onto the accumulator's k */
        if (!a->have_k) { a->k = k; a->have_k = 1; }
        double c = k - a->k;  /* sum (v - ak) = sum (v - k) + n c */
        a->s2 += s2 + 2 * c * s1 + (double)nfast * c * c;
        a->s1 += s1 + (double)nfast * c;
        a->n += nfast;
        a->zeros += zeros;
        if (lo < a->mn) a->mn = lo;
        if (up > a->mx) a->mx = up;
    }
    return g;
}
#endif

/* affine dequantization as mx.dequantize computes it: (scale * q), then + bias, each result
   rounded to the scales' dtype (sdt: 0 float32, 1 bfloat16, 2 float16); bits 2, 4 or 8,
   values packed from the low bits of each uint32; groups laid out one after another.
   Returns -1 for a layout it does not handle. */
int wb_affine(const uint32_t *w, const void *sc, const void *bi, int sdt, int64_t rows, int64_t words,
              int bits, int64_t gs, wb_acc *a) {
    if (bits != 2 && bits != 4 && bits != 8) return -1;
#ifdef WB_NO_F16
    if (sdt == 2) return -1;
#endif
    const int per = 32 / bits;
    const int64_t vals = words * per;
    if (gs <= 0 || vals % gs || gs > BLK || (gs * bits) % 32) return -1;
    const int64_t G = rows * (vals / gs), gw = gs * bits / 32;
    float t[BLK];
    int64_t fill = 0, g = 0;
#ifdef __AVX512F__
    if (bits == 4 && !getenv("WB_SCALAR")) g = affine4_avx512(w, sc, bi, sdt, G, gs, a, t, &fill);
#endif
    for (; g < G; g++) group_scalar(w + g * gw, load_s(sc, g, sdt), load_s(bi, g, sdt), sdt, bits, gs, t, &fill, a);
    if (fill) fstats(t, fill, a);
    return 0;
}
"""

_LIB = None
_LIB_LOCK = threading.Lock()


class _Acc(ctypes.Structure):
    _fields_ = [(k, ctypes.c_int64) for k in ("n", "nan", "posinf", "neginf", "zeros", "have_k")] + \
               [(k, ctypes.c_double) for k in ("min", "max", "k", "s1", "s2")]


class NativeRefused(Exception):
    """The native kernels' cache cannot be trusted (owner, mode, content hash)."""


#: why the native kernels are not in use (None: in use, or not tried yet)
NATIVE_REFUSED: str | None = None


def _cache_dir() -> str:
    d = os.environ.get("WORKBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "workbench")
    return d


def _check_dir(d: str) -> None:
    """Native code is loaded only from a directory owned by this user and writable by no one
    else, below directories that only this user or root can change (sticky ones aside)."""
    import stat

    me = os.geteuid()
    st = os.stat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise NativeRefused(f"{d} is not a directory")
    if st.st_uid != me:
        raise NativeRefused(f"{d} is owned by uid {st.st_uid}, not by this user (uid {me})")
    if st.st_mode & 0o022:
        raise NativeRefused(f"{d} is writable by {'group' if st.st_mode & 0o020 else 'others'} "
                            f"(mode {stat.S_IMODE(st.st_mode):o})")
    up = os.path.dirname(os.path.realpath(d))
    while True:
        pst = os.stat(up)
        if pst.st_uid not in (me, 0):
            raise NativeRefused(f"{d}: its parent {up} is owned by uid {pst.st_uid}")
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            raise NativeRefused(f"{d}: its parent {up} is writable by group or others")
        nxt = os.path.dirname(up)
        if nxt == up:
            return
        up = nxt


def _read_own(path: str, cap: int) -> bytes:
    """A file of ours in the checked cache: no link followed, regular, owned by this user,
    writable by no one else."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise NativeRefused(f"{path}: not a regular file owned by this user and writable only by it")
        if st.st_size > cap:
            raise NativeRefused(f"{path}: {st.st_size} bytes, larger than expected")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(st.st_size)
    finally:
        os.close(fd)


def _load_bytes(data: bytes, fallback: str) -> "ctypes.CDLL":
    """Load exactly these bytes (an anonymous memory file where the OS has one: nothing on
    disk can be swapped in between the hash check and the load)."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            fd = memfd("wb_values", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            fd = None
        if fd is not None:
            try:
                os.write(fd, data)
                return ctypes.CDLL(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)  # (the loaded mapping stays valid)
    return ctypes.CDLL(fallback)


def _compile(d: str | None = None) -> "ctypes.CDLL | None":
    """Compile (once per source / compiler / machine; cached in ``d``) and load the kernels.
    The cached library is named by its SHA-256, recorded in ``wb_values_<tag>.sha256`` when
    we compiled it; it is loaded only if the directory passes :func:`_check_dir` and its
    bytes hash to that name.  Raises NativeRefused when the cache cannot be trusted."""
    import hashlib
    import platform
    import shutil
    import subprocess
    import tempfile

    from workbench import fsio

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    tag = hashlib.sha256((_C_SRC + cc + platform.machine() + platform.node()).encode()).hexdigest()[:16]
    d = d or _cache_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError:
        return None
    _check_dir(d)
    pointer = os.path.join(d, f"wb_values_{tag}.sha256")
    data = digest = None
    if os.path.lexists(pointer):
        digest = _read_own(pointer, 128).decode("ascii", "replace").strip()
        so = os.path.join(d, f"wb_values_{tag}_{digest[:32]}.so")
        if len(digest) == 64 and os.path.lexists(so):
            data = _read_own(so, 64 << 20)
            if hashlib.sha256(data).hexdigest() != digest:
                raise NativeRefused(f"{so}: content hash differs from the one recorded when it was compiled")
    if data is None:
        with tempfile.TemporaryDirectory(dir=d) as tmp:  # (mkdtemp: private, created exclusively)
            src = os.path.join(tmp, "wb_values.c")
            out = os.path.join(tmp, "wb_values.so")
            with open(src, "w") as f:
                f.write(_C_SRC)
            base = [cc, "-O3", "-ffp-contract=off", "-shared", "-fPIC", src, "-o", out]
            for extra in (["-march=native"], ["-mcpu=native"], [], ["-DWB_NO_F16"]):
                try:
                    r = subprocess.run(base + extra, capture_output=True, timeout=120)
                except (OSError, subprocess.SubprocessError):
                    return None
                if r.returncode == 0:
                    break
            else:
                return None
            with open(out, "rb") as f:
                data = f.read()
            digest = hashlib.sha256(data).hexdigest()
            so = os.path.join(d, f"wb_values_{tag}_{digest[:32]}.so")
            os.chmod(out, 0o600)
            os.replace(out, so)  # atomic: concurrent first uses see a whole file (named by its content)
        fsio.write_text(pointer, digest + "\n")
    lib = _load_bytes(data, so)
    P, I64, A = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(_Acc)
    lib.wb_f32.argtypes = [P, I64, A]
    lib.wb_bf16.argtypes = [P, I64, A]
    lib.wb_affine.argtypes = [P, P, P, ctypes.c_int, I64, I64, ctypes.c_int, I64, A]
    lib.wb_affine.restype = ctypes.c_int
    return lib


def native():
    """The compiled kernels, or None (no compiler, WORKBENCH_NATIVE=0 / values.NATIVE False,
    or a cache that cannot be trusted: the reason is in ``NATIVE_REFUSED``)."""
    global _LIB, NATIVE_REFUSED
    if not NATIVE:
        return None
    if _LIB is None:
        with _LIB_LOCK:
            if _LIB is None:
                try:
                    _LIB = _compile() or False
                except NativeRefused as e:
                    NATIVE_REFUSED = f"native kernels not loaded: {e}"
                    _LIB = False
                except OSError:
                    _LIB = False
    return _LIB or None


def _new_acc() -> _Acc:
    a = _Acc()
    a.min, a.max = math.inf, -math.inf
    return a


def _absorb(st: "Stats", a: _Acc):
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
    a = _new_acc()
    if lib.wb_affine(w.ctypes.data, sc.ctypes.data, bi.ctypes.data, _SDT[sdtype], rows, packed, spec.bits,
                     spec.group_size, ctypes.byref(a)) != 0:
        return None
    st = Stats()
    _absorb(st, a)
    return st
