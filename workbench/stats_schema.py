"""One statistics schema for tensor values: a checkpoint's weights (``inspect --values``) and
a trace's op outputs (``Trace.stats``, the NaN hunt, ``diff``, the widgets) use these keys
with these meanings.

It lives on its own, importing nothing, so that ``checkpoint`` (which must not pull in MLX
or the tracer) and ``trace`` both depend on it and neither on the other.

Every statistics dict holds :data:`COMMON`; a trace's adds ``headroom`` and ``masked``
(:data:`TRACE_KEYS`), a checkpoint scan's adds ``count`` (:data:`CHECKPOINT_KEYS`).
"""
from __future__ import annotations

#: summaries of the finite values: None when a tensor holds no finite value (every element
#: NaN, +-Inf or mask fill, or none at all), in a trace, a checkpoint scan and JSON alike
#: (:func:`row`); never NaN, which JSON cannot hold and which compares False silently
SUMMARY = ("min", "max", "mean", "std", "absmax")
#: per-element counts of the non-finite values
NONFINITE = ("nan", "posinf", "neginf")
#: the keys of every statistics dict, in display order
COMMON = SUMMARY + NONFINITE + ("zero_frac",)
#: a trace's statistics of one op output (display order)
TRACE_KEYS = COMMON + ("headroom", "masked")
#: a checkpoint tensor's statistics (``inspect --values``)
CHECKPOINT_KEYS = COMMON + ("count",)

#: what each key means, in words (the widgets' tooltips say these)
MEANING = {
    "min": "smallest finite value",
    "max": "largest finite value",
    "mean": "average of the finite values",
    "std": "standard deviation: the typical distance of a value from the mean",
    "absmax": "absolute maximum: the largest |value|",
    "nan": "number of NaN elements",
    "posinf": "number of +Inf elements",
    "neginf": "number of -Inf elements",
    "zero_frac": "fraction of values exactly 0",
    "headroom": "absmax as a fraction of the dtype's largest finite value; near 100% is about to overflow",
    "masked": "elements equal to the dtype's lowest finite value (attention mask fill), left out of the others",
    "count": "number of elements",
}


def row(finite: bool, min, max, mean, std, absmax, nan: int, posinf: int, neginf: int, zero_frac,
        **extra) -> dict:
    """The one statistics dict: :data:`COMMON` in display order, then ``extra`` (a trace's
    ``headroom`` and ``masked``, a checkpoint scan's ``count``).  ``finite``: whether any
    element was finite (and not mask fill); without one, every :data:`SUMMARY` value is None
    whatever was passed for it."""
    if not finite:
        min = max = mean = std = absmax = None
    d = {"min": min, "max": max, "mean": mean, "std": std, "absmax": absmax,
         "nan": nan, "posinf": posinf, "neginf": neginf, "zero_frac": zero_frac}
    if extra:
        d.update(extra)
    return d


def nonfinite_count(stats: dict) -> int:
    """NaN + +Inf + -Inf elements of a statistics dict."""
    return sum(stats[k] for k in NONFINITE)
