"""Name the pattern of a finding: what kind of bug leaves this error at this op.

:func:`read` looks at the first finding of a report (the first divergence, or the first op
wrong on the engine's own inputs) with both sides' values and returns ``{"op", "pattern",
"text"}``, ``pattern`` one of:

* ``rope-frequencies``: a RoPE op whose rotary pairs keep their lengths but turn by angles
  that grow with the position while pair 0 (frequency 1 whatever the base) agrees: the
  rope theta or scaling;
* ``rope-position``: every pair turned by k x its frequency, pair 0 by k radians: the
  position fed to RoPE is off by k (a KV-cache position / offset);
* ``norm-scale-w``: a norm whose output is ours x w / (1 + w) per channel: Gemma's
  (1 + w) scale applied as w (``norm-scale``: another per-channel scale);
* ``norm-eps``: a norm whose output is ours x a factor per token, every channel alike: the
  normalizer differs (e.g. the GGUF's rms epsilon; found on a real llama.cpp dump);
* ``attention-scale``: softmax probabilities whose log is a multiple of ours (the scores
  scaled by that factor): the attention scale; ``attention-softcap``: a non-linear
  reshaping of the scores that compresses the large ones: a softcap (or a clamp);
* ``precision``: an op wrong on the engine's inputs by rounding-sized errors (about 2^-b
  relative): a matmul or accumulation in bfloat16 (b ~ 8) or float16 (b ~ 11);
* ``position``: the per-position reading (grows with the position, starts at k, one
  position alone) where nothing more specific fits.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np


def _rms(x) -> float:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]  # (a partial dump's unprinted elements are NaN)
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


def rope(op: str, ref: np.ndarray, eng: np.ndarray, decode: bool = False) -> dict | None:
    r, e = np.asarray(ref, np.float64), np.asarray(eng, np.float64)
    if r.shape != e.shape or r.ndim < 2 or r.shape[-1] % 2:
        return None
    h = r.shape[-1] // 2
    zr = r[..., :h] + 1j * r[..., h:]
    ze = e[..., :h] + 1j * e[..., h:]
    if not np.isfinite(ze).any():
        return None  # no whole rotary pair printed
    # lengths changed (beyond a printed dump's 4 decimals): not a rotation alone
    if _rms(np.abs(ze) - np.abs(zr)) > 1e-3 * max(_rms(np.abs(zr)), 1e-30) + (2e-4 if np.isnan(ze).any() else 0):
        return None
    big = np.isfinite(ze) & (np.abs(np.nan_to_num(zr)) > 1e-6 * max(_rms(np.abs(zr)), 1e-30))
    d = np.angle(ze * np.conj(zr))  # [..., T, h], wrapped
    d = np.where(big, d, np.nan)
    with np.errstate(all="ignore"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore", RuntimeWarning)
        pair0 = np.nanmedian(d[..., 0].reshape(-1, d.shape[-2]), axis=0)  # per position
    tol0 = 1e-3 if not np.isnan(ze).any() else 5e-4 / max(_rms(np.abs(zr)), 1e-30) + 1e-3
    if np.isfinite(pair0).any() and np.all(np.abs(pair0[np.isfinite(pair0)]) < tol0):
        # (called for an op found wrong: with pair 0 right, a position offset is ruled out)
        return {"op": op, "pattern": "rope-frequencies",
                "text": "RoPE turns the rotary pairs by other angles (lengths kept), growing with the position, "
                        "while pair 0 (frequency 1 for any base) agrees: the frequencies differ (rope theta / "
                        "rope scaling)"}
    p0 = pair0[np.isfinite(pair0)]
    if p0.size and np.ptp(p0) < 1e-2 and abs(p0.mean()) > 0.5:
        k = float(p0.mean())
        kk = round(k)
        if abs(k - kk) < 0.05 and kk:
            return {"op": op, "pattern": "rope-position",
                    "text": f"RoPE rotated every pair by {kk:+d} x its frequency (pair 0 by {kk:+d} rad): the position "
                            f"fed to RoPE is off by {kk:+d}" + (" (the decode step's KV-cache position)" if decode else
                                                                 " (a position offset)")}
    return {"op": op, "pattern": "rope", "text": "RoPE's angles differ (each rotary pair keeps its length): "
                                                 "its positions or frequencies"}


def norm(op: str, ref: np.ndarray, eng: np.ndarray, weight: np.ndarray | None) -> dict | None:
    r = np.asarray(ref, np.float64).reshape(-1, ref.shape[-1])
    e = np.asarray(eng, np.float64).reshape(-1, eng.shape[-1])
    ok = np.isfinite(e) & np.isfinite(r)  # (a partial dump's unprinted elements are NaN)
    r, e = np.where(ok, r, 0.0), np.where(ok, e, 0.0)
    den = (r * r).sum(0)
    c = np.where(den > 0, (e * r).sum(0) / np.where(den > 0, den, 1), 1.0)
    rows = ok.any(1)
    den1 = (r * r).sum(1)
    c1 = np.where(den1 > 0, (e * r).sum(1) / np.where(den1 > 0, den1, 1), 1.0)
    res1 = _rms(e - c1[:, None] * r)
    if rows.sum() > 1 and res1 <= 0.05 * max(_rms(e - r), 1e-30) and res1 < _rms(e - c * r):
        k = c1[rows]  # one factor per token, every channel alike: the normalizer differs, not the weight
        if np.ptp(k) >= 1e-3 * max(abs(float(k.mean())), 1e-30):
            return {"op": op, "pattern": "norm-eps",
                    "text": f"the output is ours times a per-token factor ({float(k.min()):.3g} .. {float(k.max()):.3g}), "
                            "every channel alike: the norm's normalizer differs (its epsilon, or the mean it divides by)"}
    if _rms(e - c * r) > 0.05 * max(_rms(e - r), 1e-30):
        return None
    seen = ok.any(0)  # channels with a value
    if weight is not None and weight.shape == c.shape:
        c = c[seen]
        w = np.asarray(weight, np.float64)[seen]
        if np.all(np.abs(1 + w) > 1e-3) and _rms(c - w / (1 + w)) < 1e-3 * max(_rms(c), 1e-30) + 1e-6:
            return {"op": op, "pattern": "norm-scale-w",
                    "text": "the norm's output is ours x w / (1 + w), channel by channel: its scale is w where "
                            "the checkpoint's convention is (1 + w) (Gemma's norms)"}
        if np.all(np.abs(w) > 1e-3) and _rms(c - (1 + w) / w) < 1e-3 * max(_rms(c), 1e-30) + 1e-6:
            return {"op": op, "pattern": "norm-scale-1+w",
                    "text": "the norm's output is ours x (1 + w) / w, channel by channel: it scales by (1 + w) "
                            "where the checkpoint's convention is w"}
    if np.ptp(c) < 1e-3 * max(abs(float(c.mean())), 1e-30):
        return {"op": op, "pattern": "scale", "text": f"the output is ours x {float(c.mean()):.4g} (one factor)"}
    return {"op": op, "pattern": "norm-scale", "text": "the output is ours times a per-channel factor: the norm's "
                                                      "weight is read or applied differently"}


def softmax(op: str, ref: np.ndarray, eng: np.ndarray) -> dict | None:
    r, e = np.asarray(ref, np.float64), np.asarray(eng, np.float64)
    if r.shape != e.shape or r.ndim < 2:
        return None
    r = r.reshape(-1, r.shape[-1])
    e = e.reshape(-1, e.shape[-1])
    ok = (r > 1e-12) & (e > 1e-12)
    lr = np.where(ok, np.log(np.where(ok, r, 1)), 0.0)
    le = np.where(ok, np.log(np.where(ok, e, 1)), 0.0)
    n = ok.sum(1, keepdims=True)
    keep = n[:, 0] > 1
    if not keep.any():
        return None
    lr, le, ok, n = lr[keep], le[keep], ok[keep], n[keep]
    x = np.where(ok, lr - lr.sum(1, keepdims=True) / n, 0.0)
    y = np.where(ok, le - le.sum(1, keepdims=True) / n, 0.0)
    a = float((x * y).sum() / max((x * x).sum(), 1e-300))
    resid = _rms(y[ok] - a * x[ok]) / max(_rms(y[ok] - x[ok]), 1e-30)
    if resid < 0.05:
        return {"op": op, "pattern": "attention-scale",
                "text": f"the engine's scores are ours x {a:.4g} (log-probabilities proportional, row by row): "
                        "the attention scale differs (1/sqrt(head_dim), query_pre_attn_scalar, a scaling "
                        "applied twice or not at all)"}
    return {"op": op, "pattern": "attention-softcap",
            "text": f"the engine's scores are a non-linear function of ours (not a multiple: residual {resid:.2g}), "
                    + ("the large ones compressed" if a < 1 else "the large ones stretched")
                    + ": a softcap (cap x tanh(s / cap)) or clamp differs"}


def _fit_cap(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(cap, relative residual) of y ~ cap x tanh(x / cap); cap inf when y ~ x fits best."""
    amax = float(max(np.abs(x).max(), np.abs(y).max(), 1e-30))
    best = (_rms(x - y) / max(_rms(y), 1e-30), math.inf)
    for c in np.geomspace(amax / 50, amax * 50, 400):
        res = _rms(c * np.tanh(x / c) - y) / max(_rms(y), 1e-30)
        if res < best[0]:
            best = (res, float(c))
    if math.isfinite(best[1]):
        c0 = best[1]
        for c in np.linspace(c0 * 0.97, c0 * 1.03, 301):
            res = _rms(c * np.tanh(x / c) - y) / max(_rms(y), 1e-30)
            if res < best[0]:
                best = (res, float(c))
    return best[1], best[0]


def softcap_from(op: str, pre: np.ndarray, ref: np.ndarray, eng: np.ndarray) -> dict | None:
    """Both sides' caps fitted against the values before the cap (``lm_head``, which agree)."""
    x = np.asarray(pre, np.float64).ravel()
    r, e = np.asarray(ref, np.float64).ravel(), np.asarray(eng, np.float64).ravel()
    if not (x.size == r.size == e.size) or not x.size:
        return None
    ce, re_ = _fit_cap(x, e)
    cr, rr = _fit_cap(x, r)
    if re_ > 1e-3 or rr > 1e-3 or (math.isinf(ce) and math.isinf(cr)):
        return None
    word = lambda c: "none" if math.isinf(c) else f"~{c:.3g}"
    return {"op": op, "pattern": "softcap",
            "text": f"both sides are cap x tanh(x / cap) of the head's output (which agrees): the engine's cap is "
                    f"{word(ce)}, ours {word(cr)}: the logit softcap differs (final_logit_softcapping)"}


def softcap(op: str, ref: np.ndarray, eng: np.ndarray) -> dict | None:
    """The engine's values are cap x tanh(ours / cap) (or ours are that of the engine's): a
    softcap where we have none or another cap; the cap is fitted."""
    r, e = np.asarray(ref, np.float64).ravel(), np.asarray(eng, np.float64).ravel()
    if not r.size:
        return None
    amax = float(max(np.abs(r).max(), np.abs(e).max(), 1e-30))
    best = None
    for c in np.geomspace(amax / 50, amax * 50, 400):
        for kind, a, b in (("engine", r, e), ("reference", e, r)):
            res = _rms(c * np.tanh(a / c) - b) / max(_rms(b), 1e-30)
            if best is None or res < best[0]:
                best = (res, float(c), kind)
    res, c0, kind = best
    a, b = (r, e) if kind == "engine" else (e, r)
    for c in np.linspace(c0 * 0.97, c0 * 1.03, 301):  # refine the cap between grid points
        res2 = _rms(c * np.tanh(a / c) - b) / max(_rms(b), 1e-30)
        if res2 < res:
            res, c0 = res2, float(c)
    c = c0
    if res > 1e-3 or _rms(r - e) < 1e-2 * _rms(r):
        return None
    who = "the engine caps them" if kind == "engine" else "we cap them and the engine does not"
    return {"op": op, "pattern": "softcap",
            "text": f"the values are cap x tanh(x / cap) of the other side's with cap ~ {c:.3g} ({who}): a "
                    "logit softcap differs (the config's final_logit_softcapping)"}


def precision(op: str, local_nmse: float | None) -> dict | None:
    if local_nmse is None or not (local_nmse > 0) or not math.isfinite(local_nmse):
        return None
    bits = -math.log2(math.sqrt(local_nmse))
    kind = ("bfloat16 (8 significant bits)" if bits < 10 else
            "float16 (11 significant bits)" if bits < 13 else "TF32 or a reordered float32 sum")
    return {"op": op, "pattern": "precision",
            "text": f"fed the engine's own inputs, our op differs by rounding-sized errors (~2^-{bits:.1f} "
                    f"relative), the size {kind} leaves: a matmul or its accumulation in lower precision"}


def read(report, ref: Mapping[str, Any], aligned: Mapping[str, Any], model=None, decode: bool = False) -> dict | None:
    """The pattern of the report's first finding, or None (no finding, or no reading fits)."""
    from workbench.diff.report import to_numpy

    fd = report.first_divergence
    od = fd if fd is not None else report.first_local_divergence
    if od is None:
        return None
    name = od.op
    out = None
    r = to_numpy(ref[name]) if name in ref else None
    e = aligned.get(name) if aligned else None
    if r is not None and e is not None and r.shape == e.shape:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("q_rope", "k_rope"):
            out = rope(name, r, e, decode)
        elif leaf in ("softmax",):
            out = softmax(name, r, e)
        elif leaf.endswith("norm") or leaf.endswith("layernorm"):
            w = None
            if model is not None and hasattr(model, "op_tensors"):
                try:
                    ts = model.op_tensors(name)
                    wn = next((k for k in ts if k.endswith("weight")), None)
                    w = None if wn is None else np.asarray(ts[wn].astype(__import__("mlx.core").core.float32))
                except Exception:
                    w = None
            out = norm(name, r, e, w)
        elif leaf == "logits":
            pre = ref.get("lm_head") if hasattr(ref, "get") else None
            if pre is not None:
                out = softcap_from(name, to_numpy(pre), r, e)
            if out is None:
                out = softcap(name, r, e)
    if out is None and od.local_diverged and od.local_nmse is not None and od.local_nmse < 1e-2:
        out = precision(name, od.local_nmse)
    if out is None and od.position_reading:
        out = {"op": name, "pattern": "position", "text": od.position_reading}
    return out
