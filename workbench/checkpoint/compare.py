"""``workbench inspect --diff``: what differs between two inspected checkpoints.
:func:`workbench.checkpoint.inspect.diff` inspects both and calls :func:`compare`."""
from __future__ import annotations

import math

from workbench.stats_schema import NONFINITE, SUMMARY


def _table(r, ck) -> dict:
    """canonical LM names (fused HF experts split into their halves) + other components as stored"""
    src = {d["name"]: d for d in r.tensors}
    t = {}
    for cn in ck.lm_names():
        ti = ck.info(cn)
        d = src.get(ti.source_name, {})
        q = ck.quant_of(cn[: -len(".weight")]) if cn.endswith(".weight") else None
        t[cn] = {"shape": list(ti.shape), "dtype": ti.dtype, "quantization": q.to_dict() if q else None,
                 "stats": d.get("stats") if ti.part is None else None}
    for name, d in src.items():
        if d["component"] != "language_model":
            t[name] = {"shape": d["shape"], "dtype": d["dtype"], "quantization": None, "stats": d.get("stats")}
    return t


def compare(ra, cka, rb, ckb, values: bool) -> dict:
    """What differs between two inspected checkpoints (each a Report listing its tensors and
    the Checkpoint it came from): names (canonical for the language model, as stored for
    other components), shapes, dtypes, quantization; with values, statistics."""
    ta, tb = _table(ra, cka), _table(rb, ckb)
    only_a = sorted(set(ta) - set(tb))
    only_b = sorted(set(tb) - set(ta))
    shape, dtype, quant, vals = [], [], [], []
    for k in sorted(set(ta) & set(tb)):
        x, y = ta[k], tb[k]
        if x["shape"] != y["shape"]:
            shape.append({"tensor": k, "a": x["shape"], "b": y["shape"]})
        if x["dtype"] != y["dtype"]:
            dtype.append({"tensor": k, "a": x["dtype"], "b": y["dtype"]})
        if x.get("quantization") != y.get("quantization"):
            quant.append({"tensor": k, "a": x.get("quantization"), "b": y.get("quantization")})
        if values and x.get("stats") and y.get("stats"):
            sx, sy = x["stats"], y["stats"]
            changed = {}
            for f in NONFINITE:
                if sx[f] != sy[f]:
                    changed[f] = [sx[f], sy[f]]
            for f in SUMMARY:
                u, v = sx[f], sy[f]
                if (u is None) != (v is None) or (u is not None and not math.isclose(u, v, rel_tol=1e-3, abs_tol=1e-6)):
                    changed[f] = [u, v]
            if changed:
                vals.append({"tensor": k, "changed": changed})
    res = {"a": ra.path, "b": rb.path, "same": not (only_a or only_b or shape or dtype or quant or vals),
           "model_type": [ra.model_type, rb.model_type], "only_a": only_a, "only_b": only_b, "shape": shape,
           "dtype": dtype, "quantization": quant, "values": vals if values else None}
    return res

