"""`workbench inspect`: is this checkpoint complete and sound for its config?

``inspect(path, values=False)`` returns a :class:`Report`; ``Report.to_dict()`` is the
``--json`` document:

    {"ok", "model_type", "num_layers", "components", "quantization", "moe", "problems", "tensors"}

Problem codes (stable): missing-tensor, unexpected-tensor, shape-mismatch, dtype-mismatch,
quantization-mismatch, duplicate-tensor, missing-shard, index-mismatch, truncated-file,
bad-header, path-escape, nonfinite-values, bad-config.

The work lives beside it: checks.py (the checks), value_scan.py (``values=True``),
render.py (the readable report), compare.py (``diff``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.checkpoint.checks import Context, check_arch, check_towers, quant_summary
from workbench.checkpoint.compare import compare
from workbench.checkpoint.reader import Checkpoint, CheckpointError, Problem, open_checkpoint  # noqa: F401
from workbench.checkpoint.render import render, render_diff  # noqa: F401  (the CLI's views)
from workbench.checkpoint.as_loaded import check_as_loaded

CODES = ("missing-tensor", "unexpected-tensor", "shape-mismatch", "dtype-mismatch", "quantization-mismatch",
         "duplicate-tensor", "missing-shard", "index-mismatch", "truncated-file", "bad-header", "path-escape",
         "nonfinite-values", "bad-config")


@dataclass
class Report:
    path: str
    model_type: str
    num_layers: int
    components: dict
    quantization: dict
    moe: dict | None
    problems: list = field(default_factory=list)
    tensors: list = field(default_factory=list)
    layout: str = "mlx"
    files: list = field(default_factory=list)
    total_bytes: int = 0
    grid: dict | None = None  # {"columns": [...], "rows": {layer: {column: status}}}
    list_tensors: bool = False  # --tensors: the readable report lists every tensor
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    @property
    def errors(self) -> list:
        return [p for p in self.problems if p.severity == "error"]

    def codes(self) -> set:
        return {p.code for p in self.problems}

    def to_dict(self) -> dict:
        return {"ok": self.ok, "model_type": self.model_type, "num_layers": self.num_layers,
                "components": dict(self.components), "quantization": self.quantization, "moe": self.moe,
                "problems": [p.to_dict() for p in self.problems], "tensors": list(self.tensors)}

    def render(self, color: bool = False) -> str:
        return render(self, color=color)

    def __str__(self) -> str:
        return self.render()

    def _repr_pretty_(self, p, cycle):  # IPython
        p.text(self.render())


def inspect(path, values: bool = False, *, tensors: bool = False, progress=None,
            chunk_bytes: int | None = None) -> Report:
    """Inspect a checkpoint. Raises CheckpointError when the path cannot be read as one."""
    ck = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    cx = Context(ck)
    report = Report(path=str(ck.path), model_type=ck.model_type, num_layers=ck.num_layers,
                    components=dict(sorted(ck.components.items(), key=lambda kv: kv[0] != "language_model")),
                    quantization={}, moe=None, layout=ck.layout, files=list(ck.files),
                    total_bytes=sum(sf.size for sf in ck.sfiles.values()))
    if "language_model" not in report.components and ck.tensors:
        report.components = {"language_model": 0, **report.components}
    check_arch(cx, report)
    check_towers(cx)
    check_as_loaded(cx)  # (where workbench.load opens it at module level: what the reference would refuse)
    if ck.tokenizer_path is not None and ck.tokenizer() is None and ck.tokenizer_error:  # (read as load reads it)
        cx.add("bad-config", "warning", f"{ck.tokenizer_error}: prompts must be given as token ids",
               file="tokenizer.json")
    if not report.quantization:
        report.quantization = quant_summary(ck.quant_config)
    stats = {}
    qinfo = {}
    if values:
        from workbench.checkpoint.value_scan import scan_values  # numpy and the native kernel: only here
        from workbench.checkpoint.values import CHUNK_BYTES

        stats, qinfo = scan_values(cx, report, progress, chunk_bytes or CHUNK_BYTES)
    report.list_tensors = bool(tensors)
    if values or tensors:
        canon_of = {}
        for cn, ti in ck.canonical.items():
            canon_of.setdefault(ti.source_name, []).append(cn)
        for name in ck.source_names():
            ti = ck.tensors[name]
            d = {"name": name, "canonical": (canon_of.get(name) or [None])[0] if ti.component == "language_model"
                 else None, "component": ti.component, "file": ti.file, "offset": ti.offset, "dtype": ti.dtype,
                 "shape": list(ti.shape), "nbytes": ti.nbytes}
            cn = d["canonical"]
            spec = ck.quant_of(cn[: -len(".weight")]) if cn and cn.endswith(".weight") and ti.dtype == "U32" else None
            if spec is not None:
                d["quantization"] = spec.to_dict()
            if values:
                s = stats.get(name)
                d["stats"] = s.to_dict() if s is not None else None
                if name in qinfo:
                    d["dequantized"] = True
            report.tensors.append(d)
    order = {c: i for i, c in enumerate(CODES)}
    report.problems = sorted(cx.problems, key=lambda p: (p.severity != "error", order.get(p.code, 99),
                                                          p.layer if p.layer is not None else -1, p.tensor or ""))
    return report


def diff(a, b, values: bool = False, progress=None) -> dict:
    """What differs between two checkpoints: names (canonical for the language model, as
    stored for other components), shapes, dtypes, quantization; with values, statistics
    and every tensor's bytes.  Each side is inspected first: its errors are in
    ``problems`` and keep ``verdict`` off "same" ("damaged"); ``coverage`` says how many
    tensors were compared out of how many (compare.py)."""
    cka = a if isinstance(a, Checkpoint) else open_checkpoint(a)
    ckb = b if isinstance(b, Checkpoint) else open_checkpoint(b)
    ra = inspect(cka, values=values, tensors=True, progress=progress)
    rb = inspect(ckb, values=values, tensors=True, progress=progress)
    return compare(ra, cka, rb, ckb, values)
