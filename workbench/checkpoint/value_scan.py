"""The value scan of ``inspect(values=True)``: every tensor streamed once, in chunks, through
a small thread pool (numpy and the native kernel release the GIL); quantized weights are
dequantized row by row first. Returns per-tensor :class:`~workbench.checkpoint.values.Stats`
and adds a ``nonfinite-values`` problem for every tensor holding NaN or Inf."""
from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import sys
import threading

import numpy as np

from workbench.checkpoint.checks import FLOATS, Context
from workbench.checkpoint.sfile import DTYPE_BITS
from workbench.checkpoint.values import ChunkReader, Stats, affine_stats, dequant_rows, native, pread, row_bytes, \
    to_float
from workbench.stats_schema import nonfinite_count


def scan_values(cx: Context, report, progress, chunk_bytes):
    """Statistics of every tensor's values: ({source name: Stats}, {quantized weight: (spec,
    scales info, biases info)}); problems and notes go to ``cx`` and ``report``."""
    ck = cx.ck
    qinfo = _dequantizable(ck)
    # uint8 scales of the microscaling modes are floats: E8M0 (mxfp4/8) or E4M3 (nvfp4)
    scale_fmt = {sc.source_name: ("E4M3" if spec.mode == "nvfp4" else "E8M0")
                 for spec, sc, bi in qinfo.values() if sc.dtype == "U8"}
    bar = _progress_bar(progress, sum(ti.nbytes for ti in ck.tensors.values()))
    stats = {}
    workers = max(1, min(4, os.cpu_count() or 1))
    pool = cf.ThreadPoolExecutor(workers)
    pending = collections.deque()

    failed = {}
    buffers = []  # chunk buffers, reused by every file's reader

    def drain(item):
        fut, (rd, token) = item
        key, part, nb = fut.result()
        rd.release(token)
        if isinstance(part, Exception):
            failed.setdefault(key, part)
        else:
            stats[key].merge(part)
        if bar is not None:
            bar.update(nb)

    try:
        for fname in ck.files:
            sf = ck.sfiles[fname]
            if not sf.readable:
                continue
            spans = []
            for t in sorted(sf.tensors.values(), key=lambda t: t.begin):
                if t.name in sf.truncated or ck.where.get(t.name, [fname])[0] != fname:
                    continue
                if DTYPE_BITS[t.dtype] % 8 or t.dtype == "C64":
                    report.notes.append(f"{t.name}: dtype {t.dtype} not scanned")
                    continue
                spans.append((t.name, sf.abs_offset(t), t.end - t.begin))
            while pending:  # the previous file's chunks hold that file's reader's buffers
                drain(pending.popleft())
            reader = ChunkReader(sf.path, chunk_bytes, nbuf=2 * workers + 8, pool=buffers)
            rows_done = {}
            for key, b, token in _aligned(reader, spans, sf, qinfo, chunk_bytes):
                if key not in stats:
                    stats[key] = Stats()
                if b is None:
                    continue
                t = sf.tensors[key]
                if key in qinfo:
                    spec, sc, bi = qinfo[key]
                    row = rows_done.get(key, 0)
                    rows = len(b) // (t.shape[-1] * 4)
                    rows_done[key] = row + rows
                    task = (key, b, t.dtype, (t.shape[-1], spec, sc, bi, row, rows))
                else:
                    task = (key, b, scale_fmt.get(key, t.dtype), None)
                if len(b) < _INLINE:  # small tensors (norms, scales): no thread hand-off
                    fut = cf.Future()
                    fut.set_result(_chunk_stats_safe(ck, task))
                else:
                    fut = pool.submit(_chunk_stats_safe, ck, task)
                pending.append((fut, (reader, token)))
                while len(pending) > 2 * workers:
                    drain(pending.popleft())
        while pending:
            drain(pending.popleft())
    except (OSError, EOFError) as e:
        cx.add("truncated-file", "error", f"reading values failed: {e}")
    finally:
        for f, _ in pending:
            f.cancel()
        pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
    _report_values(cx, report, stats, failed, qinfo)
    return stats, qinfo


def _dequantizable(ck) -> dict:
    """Quantized weights whose values can be dequantized as stored: source name -> (spec,
    scales info, biases info). Others (no spec, a global scale on top, companions of the
    wrong dtype or shape, truncated) have their raw values scanned."""
    qinfo = {}
    for cn, ti in ck.canonical.items():
        if cn.endswith(".weight") and ti.dtype == "U32" and ti.part is None:
            mod = cn[: -len(".weight")]
            sc = ck.canonical.get(mod + ".scales")
            if sc is None:
                continue
            spec = ck.quant_of(mod)
            if spec is None:
                continue
            if mod + ".global_scale" in ck.canonical:
                continue  # per-expert tensor scale on top: raw values scanned (noted)
            bi = ck.canonical.get(mod + ".biases") if spec.mode == "affine" else None
            if spec.mode == "affine" and (bi is None or sc.dtype not in FLOATS or bi.dtype not in FLOATS):
                continue  # cannot be dequantized as stored (reported by the checks): raw values scanned
            if sc.source_name in ck.sfiles[sc.file].truncated or (bi and bi.source_name in ck.sfiles[bi.file].truncated):
                continue
            if (ti.shape[-1] * 32) % spec.bits or tuple(sc.shape[:-1]) != tuple(ti.shape[:-1]):
                continue
            if bi is not None and tuple(bi.shape) != tuple(sc.shape):
                continue
            qinfo[ti.source_name] = (spec, sc, bi)
    return qinfo


def _progress_bar(progress, total: int):
    """A tqdm bar over ``total`` bytes on stderr (by default only when it is a terminal), or None."""
    bar = None
    if progress is None:
        progress = sys.stderr.isatty()
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="values", leave=False, file=sys.stderr)
        except ImportError:  # pragma: no cover
            bar = None
    return bar


def _report_values(cx, report, stats, failed, qinfo):
    """Tensors whose statistics failed become notes (and leave ``stats``); NaN / Inf, except a
    clip bound's "no clipping" infinity, become ``nonfinite-values`` problems."""
    ck = cx.ck
    for name, e in failed.items():
        stats.pop(name, None)
        ti = ck.tensors[name]
        report.notes.append(f"values of {name} ({ti.file}, byte {ti.offset}) could not be computed: {e}")
    for name, s in stats.items():
        ti = ck.tensors[name]
        d = s.to_dict()
        if nonfinite_count(d) and not _no_clip_bound(name, d):
            cx.add("nonfinite-values", "error",
                   f"{name} holds {d['nan']} NaN, {d['posinf']} +Inf, {d['neginf']} -Inf of {d['count']} values"
                   f"{' (after dequantization)' if name in qinfo else ''}", tensor=name, file=ti.file)


#: clip bounds (transformers' Gemma4ClippableLinear buffers): +Inf as an upper bound or -Inf
#: as a lower bound means "no clipping", a legitimate value
_CLIP_BOUNDS = {"input_max": "posinf", "output_max": "posinf", "input_min": "neginf", "output_min": "neginf"}


def _no_clip_bound(name: str, d: dict) -> bool:
    """True when a tensor's only non-finite values are a clip bound's "no clipping" infinity."""
    sign = _CLIP_BOUNDS.get(name.rsplit(".", 1)[-1])
    return sign is not None and d["nan"] == 0 and d["posinf" if sign == "neginf" else "neginf"] == 0


_TLS = threading.local()
_INLINE = 1 << 18  # chunks smaller than this (bytes) are done on the reading thread
_SUB = 1 << 17  # elements per statistics pass (256 KB of BF16): stays in the L2 cache


def _chunk_stats_safe(ck, task):
    try:
        return _chunk_stats(ck, task)
    except (ValueError, RuntimeError, OSError, TypeError) as e:  # e.g. scales that MLX refuses
        return task[0], e, len(task[1])


def _chunk_stats(ck, task):
    """One chunk's partial statistics (runs in a worker thread; numpy releases the GIL)."""
    key, b, fmt, q = task
    u32 = getattr(_TLS, "u32", None)
    if u32 is None:  # per-thread scratch for one cache-sized piece
        u32 = _TLS.u32 = np.empty(_SUB, np.uint32)
        _TLS.u16 = np.empty(_SUB, np.uint16)
        _TLS.bools = np.empty(_SUB, np.bool_)
    part = Stats()
    sub = 1 << 30 if native() else _SUB  # numpy: cache-sized pieces, its passes over each stay in L2
    if q is None and fmt == "BF16":
        u = np.frombuffer(b, np.uint16)
        for i in range(0, u.size, sub):
            part.add_bf16(u[i: i + sub], u32, _TLS.u16)
    elif q is None:
        x = to_float(b, fmt)
        for i in range(0, x.size, sub):
            part.add(x[i: i + sub], _TLS.bools)
    else:
        packed, spec, sc, bi, row, rows = q
        srb = row_bytes(sc.dtype, sc.shape)
        sb = pread(os.path.join(str(ck.root), sc.file), sc.offset + row * srb, rows * srb)
        bb = pread(os.path.join(str(ck.root), bi.file), bi.offset + row * srb, rows * srb) if bi else None
        fast = affine_stats(b, sb, bb, rows, packed, spec, sc.dtype)  # one native pass, None if unavailable
        if fast is not None:
            return key, fast, len(b)
        x = dequant_rows(b, sb, bb, rows, packed, sc.shape[-1], spec, sc.dtype)
        for i in range(0, x.size, _SUB):
            if x.dtype == np.uint16:
                part.add_bf16(x[i: i + _SUB], u32, _TLS.u16)
            else:
                part.add(x[i: i + _SUB], _TLS.bools)
    return key, part, len(b)


def _aligned(reader, spans, sf, qinfo, chunk_bytes):
    """Chunks from the reader, re-cut so that quantized weights come in whole rows and other
    tensors in whole elements."""
    pend = {}
    for key, raw, n in reader.ranges(spans):
        if raw is None:
            rest = pend.pop(key, b"")
            if rest:
                yield key, rest, None
            yield key, None, None
            continue
        t = sf.tensors[key]
        unit = t.shape[-1] * 4 if key in qinfo else max(1, DTYPE_BITS[t.dtype] // 8)
        if key not in pend and n % unit == 0:  # the common case: hand the pooled buffer on
            yield key, memoryview(raw)[:n], raw
            continue
        buf = pend.pop(key, b"") + bytes(memoryview(raw)[:n])
        reader.release(raw)
        cut = len(buf) - len(buf) % unit
        if cut:
            yield key, buf[:cut] if cut != len(buf) else buf, None
        if cut != len(buf):
            pend[key] = buf[cut:]

