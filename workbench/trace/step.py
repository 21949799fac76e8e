"""What a trace records of one executed op (:class:`Step`), the non-finite breakpoint, and
the trace's error."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.dtypes import dtype_name
from workbench.stats_schema import nonfinite_count
from workbench.trace import stats as _stats

#: the breakpoint that stops at the first op with a NaN or an infinity in its output
NONFINITE = "nonfinite"

@dataclass
class Step:
    """What one executed op did."""

    name: str
    kind: str
    layer: int | None
    index: int
    input_shapes: tuple
    output_shape: tuple
    dtype: str
    stats: dict | None = None
    intervened: tuple = ()

    @property
    def nonfinite(self) -> bool:
        s = self.stats
        return bool(s and nonfinite_count(s))

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "kind": self.kind, "layer": self.layer,
                "input_shapes": [list(s) for s in self.input_shapes], "output_shape": list(self.output_shape),
                "dtype": self.dtype, "stats": _stats.jsonable(self.stats) if self.stats else None,
                "intervened": list(self.intervened)}

    @classmethod
    def from_dict(cls, d: dict) -> "Step":
        """The Step of a :meth:`to_dict` record (as another process sent it)."""
        return cls(d["name"], d["kind"], d["layer"], int(d["index"]), tuple(tuple(s) for s in d["input_shapes"]),
                   tuple(d["output_shape"]), d["dtype"], d["stats"], tuple(d["intervened"]))

    def __repr__(self) -> str:
        s = self.stats
        extra = ""
        if s:
            bad = f" nan={s['nan']} +inf={s['posinf']} -inf={s['neginf']}" if self.nonfinite else ""
            hr = s.get("headroom")
            extra = (f" absmax={_fmt(s['absmax'])} mean={_fmt(s['mean'])} std={_fmt(s['std'])}"
                     f"{'' if hr is None else f' headroom={_fmt(hr)}'}{bad}")
        iv = f" [{'; '.join(self.intervened)}]" if self.intervened else ""
        return f"<Step {self.index} {self.name} ({self.kind}) {list(self.output_shape)} {self.dtype}{extra}{iv}>"


def headroom_rows(steps, top: int | None = None) -> list[tuple[str, float]]:
    """(op, absmax / dtype max) of the steps with a headroom statistic, closest to overflow
    first (the ``top`` first when given)."""
    rows = [(s.name, s.stats["headroom"]) for s in steps if s.stats and s.stats.get("headroom") is not None]
    rows.sort(key=lambda r: -r[1])
    return rows[:top] if top else rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


_DTYPE_NAMES: dict = {}


def dtype_str(d) -> str:
    """``dtype_name`` memoized (called once per executed op)."""
    s = _DTYPE_NAMES.get(d)
    if s is None:
        s = _DTYPE_NAMES[d] = dtype_name(d)
    return s


class TraceError(RuntimeError):
    """A trace cannot do what was asked (clear message, no library traceback needed)."""
