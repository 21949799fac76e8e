"""Cache consistency: a cached decode of the last token against one forward over them all.

    r = workbench.cache_check(model, "the cat sat")      # text or token ids, >= 2 tokens
    r.consistent, r.first                                 # True / the first name beyond tolerance
    r.rows                                                # per layers.{i}, then logits
    r.tf32                                                # could TF32 explain a difference?
    r.to_dict()                                           # the ``--json`` document

Prefill the first T-1 tokens through the model's KV cache, decode the last one through
the same cache, and compare the residual stream after every layer (``layers.{i}``) and the
``logits`` at the last position with one forward over all T tokens (no cache).  Op
programs run with the KV cache our generation uses (``model.make_cache()``,
workbench/trace/generate.py); a module-level model with the reference's own cache (mlx-lm's
``make_cache()``).  A cache that is right gives the same values up to rounding: the decode
multiplies [1, d] rows where the forward multiplies [T, d] blocks, and attention reduces
over the keys in another order.

Each compared value gets the tolerance of its dtype (:data:`TOLERANCE`), as a relative
error: the largest absolute difference at the last position over the largest magnitude of
the one-forward value there.  The first name over it is the finding.

TF32: on CUDA, MLX runs float32 matmuls in TF32 by default (``MLX_ENABLE_TF32``, 10-bit
mantissa): a float32 comparison then differs at about float16's precision.  The report
says whether that applies (a GPU, float32, TF32 on) and whether the first difference is
small enough for it to explain (within the float16 tolerance); on the CPU it does not.

Testing aid: ``WORKBENCH_CACHE_PLANT=position`` plants an off-by-one position in the
decode (op programs: the RoPE offset fed to the decoding forward is one too far; module
level: the reference cache's offset is moved one on before the decode, so the new key is
rotated for, and written at, the next position); the check must then name ``layers.0``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from workbench.dtypes import dtype_name

#: relative tolerance per dtype (max |cached - forward| / max |forward| at the last position).
#: float32: differences seen on the CPU are 1e-7 to 2e-6 (tens of ulps after a few layers);
#: 1e-4 leaves room for deeper models and still catches TF32 (~1e-3 at layer 0).  float16
#: and bfloat16: about 10 and 4 units in the last place of a value near the largest (2^-10,
#: 2^-7 apart): the two paths round differently, and the difference grows with depth.
TOLERANCE: dict[str, float] = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3.125e-2}
#: what TF32 (float16's mantissa) can account for in a float32 comparison
TF32_TOLERANCE = TOLERANCE["float16"]
PLANT_ENV = "WORKBENCH_CACHE_PLANT"
_PLANTS = ("position",)


@dataclass
class CacheCheck:
    consistent: bool
    first: str | None            # the first name (layers.{i} or logits) beyond its tolerance
    rows: list[dict]             # {"name", "dtype", "max_abs", "rel", "tolerance", "ok"}
    tokens: int                  # T: prefill T-1, decode 1
    granularity: str             # "op" | "module"
    cache: str                   # the cache's type
    device: str
    argmax: dict = field(default_factory=dict)   # {"forward", "cached", "same"}
    tf32: dict = field(default_factory=dict)     # {"applies", "enabled", "explains", "note"}
    plant: str | None = None

    @property
    def finding(self) -> dict | None:
        return next((r for r in self.rows if not r["ok"]), None)

    @property
    def layer(self) -> int | None:
        """The first differing layer's index (None: consistent, or only the logits differ)."""
        if self.first and self.first.startswith("layers."):
            return int(self.first.split(".")[1])
        return None

    def to_dict(self) -> dict:
        """The ``--json`` document (an infinite difference, from a NaN or Inf on one side only,
        is the string "inf")."""
        fin = lambda v: v if math.isfinite(v) else "inf"  # noqa: E731
        rows = [dict(r, rel=fin(r["rel"]), max_abs=fin(r["max_abs"])) for r in self.rows]
        return {"consistent": self.consistent, "first": self.first, "layer": self.layer,
                "tokens": self.tokens, "granularity": self.granularity, "cache": self.cache,
                "device": self.device, "argmax": dict(self.argmax), "tf32": dict(self.tf32),
                "plant": self.plant, "tolerance": dict(TOLERANCE), "rows": rows}

    def lines(self) -> list[str]:
        how = (f"prefill {self.tokens - 1} + decode 1 through {self.cache} vs one forward of {self.tokens} "
               f"tokens ({self.granularity}, {self.device})")
        out = []
        if self.consistent:
            worst = max(self.rows, key=lambda r: r["rel"] / r["tolerance"])
            out.append(f"consistent: {how}")
            out.append(f"  largest difference {worst['rel']:.3g} relative at {worst['name']} "
                       f"({worst['dtype']}, tolerance {worst['tolerance']:g})")
        else:
            f = self.finding
            out.append(f"inconsistent at {f['name']}: {f['rel']:.3g} relative (max abs {f['max_abs']:.3g}), "
                       f"tolerance {f['tolerance']:g} for {f['dtype']}")
            out.append(f"  {how}")
            for r in self.rows:
                out.append(f"  {'ok ' if r['ok'] else 'BAD'} {r['name']:<12} {r['rel']:10.3g}  {r['dtype']}")
            out.append(f"  argmax: forward {self.argmax.get('forward')}, cached {self.argmax.get('cached')}")
        out.append(f"  TF32: {self.tf32.get('note')}")
        if self.plant:
            out.append(f"  (planted: {self.plant}, {PLANT_ENV})")
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())


def device_kind() -> str:
    """The default device: "cpu", "cuda" or "metal"."""
    dev = mx.default_device()
    if dev.type == mx.cpu:
        return "cpu"
    return "cuda" if hasattr(mx, "cuda") and mx.cuda.is_available() else "metal"


def tf32_status(dtype: str, first_rel: float | None = None, device: str | None = None) -> dict:
    """Whether TF32 applies to a ``dtype`` comparison on ``device`` (default: the default
    device, :func:`device_kind`), and whether it could explain a first difference of
    ``first_rel`` (None: none found).  On the default GPU, what its float32 matmuls ran as
    comes from ``workbench.precision.matmul_precision`` where that module exists (a probe:
    MLX fixes TF32 for the process at its first float32 GPU matmul), else from
    ``MLX_ENABLE_TF32``."""
    probe = device is None
    device = device or device_kind()
    if device == "cpu":
        return {"applies": False, "enabled": None, "explains": False,
                "note": "not applicable (the CPU computes float32 matmuls in float32)"}
    if dtype != "float32":
        return {"applies": False, "enabled": None, "explains": False,
                "note": f"not applicable (TF32 changes float32 matmuls only; this ran in {dtype})"}
    enabled = None
    if probe:
        try:
            from workbench.precision import TF32, matmul_precision
        except ImportError:
            pass
        else:
            enabled = matmul_precision(mx.float32) == TF32
    if enabled is None:
        if device != "cuda":
            return {"applies": False, "enabled": None, "explains": False,
                    "note": "not applicable (Metal computes float32 matmuls in float32)"}
        enabled = os.environ.get("MLX_ENABLE_TF32", "1").strip().lower() not in ("0", "false", "off", "no")
    if not enabled:
        return {"applies": False, "enabled": False, "explains": False,
                "note": f"off ({device}: float32 matmuls ran in float32; MLX_ENABLE_TF32=0)"}
    explains = first_rel is not None and first_rel <= TF32_TOLERANCE
    if first_rel is None:
        note = f"on ({device}, float32): matmuls ran in TF32, and the two paths still agree"
    elif explains:
        note = (f"could explain it: {device} ran these float32 matmuls in TF32 (10-bit mantissa) and the difference "
                f"is within {TF32_TOLERANCE:g}; rerun with MLX_ENABLE_TF32=0 to tell")
    else:
        note = f"on, but cannot explain it: the difference is beyond TF32's {TF32_TOLERANCE:g}"
    return {"applies": True, "enabled": True, "explains": explains, "note": note}


def _plant() -> str | None:
    p = os.environ.get(PLANT_ENV, "").strip()
    if not p:
        return None
    if p not in _PLANTS:
        raise ValueError(f"{PLANT_ENV}={p!r}: the plants are {', '.join(_PLANTS)}")
    return p


def _layer_names(t) -> list[str]:
    names = []
    for s in t.steps:
        parts = s.name.split(".")
        if len(parts) == 2 and parts[0] == "layers" and parts[1].isdigit():
            names.append(s.name)
    return names


def _last(v) -> mx.array:
    return v[..., -1, :].astype(mx.float32)


def cache_check(model, ids, dtype=None, *, tolerance: dict | None = None) -> CacheCheck:
    """Prefill(T-1) + decode(1) through ``model``'s KV cache against one forward of all T
    tokens; compares ``layers.{i}`` and ``logits`` at the last position (see the module
    docstring).  ``ids``: text or token ids of one sequence, at least 2 tokens.
    ``tolerance``: {dtype name: relative tolerance}, replacing entries of :data:`TOLERANCE`."""
    from workbench.trace.entry import prepare_ids, trace
    from workbench.trace.options import Run
    from workbench.trace.step import TraceError

    tol = dict(TOLERANCE)
    for k, v in (tolerance or {}).items():
        if k not in tol or not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ValueError(f"tolerance: {{dtype: number > 0}} for dtypes {', '.join(tol)}, not {k!r}: {v!r}")
        tol[k] = float(v)
    plant = _plant()
    x, mask, batched = prepare_ids(model, ids)
    if x.shape[0] != 1:
        raise ValueError(f"cache_check takes one sequence, not a batch of {x.shape[0]}")
    T = x.shape[1]
    if T < 2:
        raise ValueError("cache_check needs at least 2 tokens (a prefill of T-1 and a decode of 1)")
    module = model.granularity == "module"
    capture = ["re:layers\\.\\d+", "logits"]

    def done(t, what):
        t.run()
        if not t.done:
            raise TraceError(f"the {what} stopped at {t.steps[-1].name!r} before the logits")
        return t

    full = done(trace(model, x, capture=capture, dtype=dtype), "forward")
    names = _layer_names(full) + ["logits"]
    want = {n: _last(full.value(n)) for n in names}
    dtypes = {n: dtype_name(full.value(n).dtype) for n in names}
    del full

    cache = model.make_cache()
    done(trace(model, x[:, :-1], capture=None, dtype=dtype, run=Run(cache=cache)), "prefill")
    restore = None
    if plant == "position":
        if module:
            for c in (cache if isinstance(cache, (list, tuple)) else [cache]):
                if hasattr(c, "offset"):
                    c.offset += 1
        else:
            feeds = model.feeds

            def shifted(*a, **kw):
                f = feeds(*a, **kw)
                return dict(f, rope_offset=f["rope_offset"] + 1)
            model.feeds = shifted
            restore = lambda: vars(model).pop("feeds", None)  # noqa: E731
    try:
        dec = done(trace(model, x[:, -1:], capture=capture, dtype=dtype, run=Run(cache=cache)), "decode")
    finally:
        if restore is not None:
            restore()
    rows = []
    for n in names:
        a, b = want[n], _last(dec.value(n))
        diff = mx.abs(b - a)
        scale = mx.abs(a).max()
        max_abs, big = mx.max(diff).item(), scale.item()
        if mx.array_equal(a, b, equal_nan=True).item():
            rel = max_abs = 0.0  # (the same NaN / Inf on both sides is no cache difference)
        elif not (mx.isfinite(a).all().item() and mx.isfinite(b).all().item()) or not math.isfinite(big):
            rel = max_abs = float("inf")
        else:
            rel = max_abs / big if big > 0 else float("inf")
        t = tol.get(dtypes[n], tol["float32"])
        rows.append({"name": n, "dtype": dtypes[n], "max_abs": float(max_abs), "rel": float(rel),
                     "tolerance": t, "ok": bool(rel <= t)})
    fa = int(mx.argmax(want["logits"], axis=-1)[0].item())
    fb = int(mx.argmax(_last(dec.value("logits")), axis=-1)[0].item())
    first = next((r for r in rows if not r["ok"]), None)
    ref_dtype = dtypes[names[0]]
    kind = cache if not isinstance(cache, (list, tuple)) else (cache[0] if cache else None)
    kind_name = type(kind).__name__
    lib = str(getattr(model, "library", None) or "the reference").replace("_", "-")
    return CacheCheck(consistent=first is None, first=first["name"] if first else None, rows=rows, tokens=T,
                      granularity="module" if module else "op",
                      cache=(f"{lib}'s " if module else "our ") + kind_name, device=device_kind(),
                      argmax={"forward": fa, "cached": fb, "same": fa == fb},
                      tf32=tf32_status(ref_dtype, first["rel"] if first else None), plant=plant)
