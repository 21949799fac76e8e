"""Weights in an engine dump, compared with the checkpoint's.

Engines often dump the weights they loaded next to their activations.  A tensor whose
(renamed) name is a checkpoint tensor (``layers.0.self_attn.q_proj.weight``) is compared
with the checkpoint's own values, dequantized when the checkpoint packs them: this finds a
wrong dequantization (group size, scales, biases, the mxfp4 / nvfp4 scale format), a
transposed or permuted matrix (reported in ``layout``), or the wrong tensor loaded under a
name, before any activation is involved.  Limits are the local ones (one rounding step):
``local_min_cosine`` and ``local_max_nmse`` of the :class:`~workbench.diff.metrics.Tolerance`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from workbench.arrays import finite_or_none, weight_values  # noqa: F401  (weight_values re-exported: diff.weight_values)
from workbench.diff.layout import LayoutError, reconcile
from workbench.diff.metrics import Tolerance, error_metrics, local_diverged, nonfinite_reasons


@dataclass
class WeightDiff:
    """One engine tensor compared with the checkpoint tensor of the same (renamed) name."""

    name: str  # the checkpoint tensor
    engine_name: str
    status: str  # "ok" | "diverged" | "shape" | "ambiguous" | "unreadable"
    shape: tuple[int, ...] = ()
    engine_shape: tuple[int, ...] = ()
    layout: str = ""
    cosine: float | None = None
    nmse: float | None = None
    max_abs: float | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def is_mismatch(self) -> bool:
        return self.status in ("diverged", "shape")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "engine_name": self.engine_name, "status": self.status,
                "shape": list(self.shape), "engine_shape": list(self.engine_shape), "layout": self.layout,
                "cosine": finite_or_none(self.cosine), "nmse": finite_or_none(self.nmse), "max_abs": finite_or_none(self.max_abs),
                "reasons": list(self.reasons)}


def is_checkpoint_tensor(model: Any, name: str) -> bool:
    ck = getattr(model, "checkpoint", None)
    try:
        return ck is not None and name in ck
    except TypeError:
        return False


def compare_weights(model: Any, engine: Mapping[str, tuple[str, np.ndarray]], tol: Tolerance) -> list[WeightDiff]:
    """``engine``: checkpoint tensor name -> (engine name, array).  In checkpoint order."""
    out = []
    for name in sorted(engine):
        en, arr = engine[name]
        arr = np.asarray(arr, dtype=np.float32)
        wd = WeightDiff(name=name, engine_name=en, status="ok", engine_shape=tuple(arr.shape))
        try:
            ours = weight_values(model, name)
        except (KeyError, ValueError) as e:
            wd.status, wd.reasons = "unreadable", [str(e)]
            out.append(wd)
            continue
        wd.shape = tuple(ours.shape)
        try:
            arr, wd.layout = reconcile(arr, ours.shape)
        except LayoutError as e:
            wd.status, wd.reasons = e.kind, [str(e)]
            out.append(wd)
            continue
        m = error_metrics(ours, arr, mask_below=None)
        if local_diverged(m, tol) and arr.ndim == 2 and arr.shape[0] == arr.shape[1]:
            mt = error_metrics(ours, arr.T, mask_below=None)  # a square matrix stored transposed
            if not local_diverged(mt, tol):
                m, wd.layout = mt, f"{list(arr.shape)} square: matches transposed"
        wd.cosine, wd.nmse, wd.max_abs = m["cosine"], m["nmse"], m["max_abs"]
        if local_diverged(m, tol):
            wd.status = "diverged"
            f = m["finite"] or m  # the metrics are NaN beside a non-finite element: say so, and show the rest
            over = "" if m["finite"] is None else f" over the {f['elements']} element(s) finite in both"
            wd.reasons = nonfinite_reasons(m, "the checkpoint") + [
                f"cosine {f['cosine']:.6g}, nmse {f['nmse']:.3g} against the checkpoint's values{over}"
                + (" (dequantized)" if name.endswith(".weight") and _packed(model, name) else "")]
        if wd.layout and "transposed" in wd.layout:
            wd.reasons.append(f"the engine holds it transposed ({wd.layout}): fine if its matmul expects that")
        out.append(wd)
    return out


def _packed(model: Any, name: str) -> bool:
    ck = getattr(model, "checkpoint", model)
    return f"{name[: -len('.weight')]}.scales" in ck
