"""What a trace records of one executed op (:class:`Step`), the non-finite breakpoint, and
the trace's error."""
from __future__ import annotations

from workbench.dtypes import dtype_name
from workbench.stats_schema import nonfinite_count
from workbench.trace import stats as _stats

#: the breakpoint that stops at the first op with a NaN or an infinity in its output
NONFINITE = "nonfinite"

_FIELDS = ("name", "kind", "layer", "index", "input_shapes", "output_shape", "dtype", "stats", "intervened")


class Step:
    """What one executed op did: ``name``, ``kind``, ``layer``, ``index``, ``input_shapes``,
    ``output_shape``, ``dtype``, ``stats`` (a dict, or None: not captured) and ``intervened``
    (the labels of the interventions applied).

    A trace makes one when it is first read (its hot path records only the output's shape
    and dtype), as a slotted class, and its statistics may arrive folded with a whole
    forward's (:class:`workbench.trace.stats.Rows`): the dict is then made when ``stats`` is
    first read."""

    __slots__ = ("name", "kind", "layer", "index", "input_shapes", "output_shape", "dtype", "intervened",
                 "_stats", "_row")

    def __init__(self, name: str, kind: str, layer: int | None, index: int, input_shapes: tuple,
                 output_shape: tuple, dtype: str, stats: dict | None = None, intervened: tuple = ()):
        self.name = name
        self.kind = kind
        self.layer = layer
        self.index = index
        self.input_shapes = input_shapes
        self.output_shape = output_shape
        self.dtype = dtype
        self._stats = stats
        self._row = None
        self.intervened = intervened

    @property
    def stats(self) -> dict | None:
        if self._row is not None:
            rows, j = self._row
            self._stats, self._row = rows[j], None
        return self._stats

    @stats.setter
    def stats(self, value: dict | None) -> None:
        self._stats, self._row = value, None

    def stats_from(self, rows, j: int) -> None:
        """Take row ``j`` of ``rows`` (a sequence of stats dicts) as the statistics, read when
        first asked for."""
        self._stats, self._row = None, (rows, j)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    __hash__ = None  # (mutable, compared by value)

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
