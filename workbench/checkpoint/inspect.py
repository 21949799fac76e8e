"""`workbench inspect`: is this checkpoint complete and sound for its config?

``inspect(path, values=False)`` returns a :class:`Report`; ``Report.to_dict()`` is the
``--json`` document:

    {"ok", "model_type", "num_layers", "components", "quantization", "moe", "problems", "tensors"}

Problem codes (stable): missing-tensor, unexpected-tensor, shape-mismatch, dtype-mismatch,
quantization-mismatch, duplicate-tensor, missing-shard, index-mismatch, truncated-file,
bad-header, path-escape, nonfinite-values, bad-config.
"""
from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

from workbench import registry
from workbench.checkpoint import names as N
from workbench.checkpoint.quant import infer
from workbench.checkpoint.reference_arch import check_layout
from workbench.checkpoint.reader import Checkpoint, CheckpointError, Problem, open_checkpoint  # noqa: F401
from workbench.checkpoint.sfile import DTYPE_BITS

CODES = ("missing-tensor", "unexpected-tensor", "shape-mismatch", "dtype-mismatch", "quantization-mismatch",
         "duplicate-tensor", "missing-shard", "index-mismatch", "truncated-file", "bad-header", "path-escape",
         "nonfinite-values", "bad-config")

_FLOATS = {"BF16", "F16", "F32"}


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


# ---------------------------------------------------------------------- checks
class _Ctx:
    def __init__(self, ck: Checkpoint):
        self.ck = ck
        self.problems: list[Problem] = list(ck.problems)
        # how this checkpoint spells LM names: canonical -> stored prefix
        pre = Counter()
        for cn, ti in ck.canonical.items():
            if ti.source_name.endswith(cn):
                pre[ti.source_name[: len(ti.source_name) - len(cn)]] += 1
        self.prefix = pre.most_common(1)[0][0] if pre else ("model." if ck.config else "")

    def stored(self, canon: str) -> str:
        ti = self.ck.canonical.get(canon)
        if ti is not None:
            return ti.source_name
        if canon.startswith("lm_head"):
            return ("language_model." if self.prefix.startswith("language_model.") else "") + canon
        return self.prefix + canon

    def add(self, code, severity, message, tensor=None, file=None, layer=None, suggestion=None):
        if layer is None and tensor:
            layer = N.layer_of(tensor)
        ti = self.ck.tensors.get(tensor) if tensor else None
        if ti is not None and "byte" not in message:  # where it lies: file and byte offset
            message += f" [{ti.file}, byte {ti.offset}]"
            file = file or ti.file
        self.problems.append(Problem(code, severity, message, tensor, file, layer, suggestion))


#: unexpected / missing tensors that get a difflib nearest-name suggestion (each costs a few
#: dozen string comparisons; a hostile checkpoint with 100k of them stays fast)
SUGGEST_MAX = 2000


def _check_arch(cx: _Ctx, report: Report):
    ck = cx.ck
    a = ck.arch
    if a is None:
        err = ck.arch_error
        if ck.config_present and err:
            unsupported = "not a supported family" in err or "not available yet" in err
            cx.add("bad-config", "warning" if unsupported else "error", err + ("" if unsupported else
                   "; completeness not checked"), file="config.json")
        return None
    present = {n: ck.canonical[n] for n in ck.lm_names()}
    exp = a.expected
    modules = a.modules()
    # tensors of unreadable / missing shards are not "missing": their files are reported
    unknown_files = {f for f, sf in ck.sfiles.items() if not sf.readable} | set(ck.missing_shards)
    covered = set()
    if ck.index:
        for n, f in ck.index["weight_map"].items():
            if f in unknown_files:
                covered.update(cn for cn, _ in N.canonical(n))
        for ns in ck.index["escaped"].values():
            for n in ns:
                covered.update(cn for cn, _ in N.canonical(n))
    for sf in ck.sfiles.values():
        for n in sf.broken:
            covered.update(cn for cn, _ in N.canonical(n))
    blind = bool(unknown_files) and not ck.index

    quant_names = set()
    for mod, e in modules.items():
        quant_names.update({mod + ".scales", mod + ".biases"})
        if e.kind == "experts":  # nvfp4 switch layers may carry one tensor scale per expert
            quant_names.add(mod + ".global_scale")
    unexpected = [n for n in present if n not in exp and n not in quant_names]
    made = set()
    if unexpected and registry.table_family(ck.config) is None:  # a layout the reference converts?
        lay = check_layout(ck.config, exp, present)
        unexpected, made = [n for n in unexpected if n not in lay.consumed], lay.produced
        for code, msg, tensor in lay.problems:
            cx.add(code, "error", msg, tensor=tensor)
        report.notes.extend(lay.notes)
    missing = [e for e in exp.values() if not e.optional and e.name not in present and e.name not in covered
               and e.name not in made]
    if blind:
        missing = []
        report.notes.append("a shard's header is unreadable and there is no index: missing tensors not listed")
    miss_names = [e.name for e in missing]
    for e in missing:
        if e.quantizable and e.name.endswith(".weight") and ck.quant_config.present:
            miss_names += [e.module + ".scales", e.module + ".biases"]
    # misnamed vs missing: nearest expected name for every unexpected tensor (candidates from
    # the same layer, through an index: near-linear even with 100k unexpected tensors)
    miss_by, exp_by = N.NearIndex(miss_names), N.NearIndex(exp)
    renamed, rules = _rename_matches(unexpected, miss_names)
    if rules:
        (a_, b_), cnt = rules.most_common(1)[0]
        if cnt >= 3:
            how = f"an extra leading {b_!r}" if not a_ else f"{a_!r} -> {b_!r} in the name"
            report.notes.append(f"{cnt} unexpected tensors are expected ones renamed ({how}): misnamed, not missing")
    if len(unexpected) > SUGGEST_MAX or len(missing) > SUGGEST_MAX:
        report.notes.append(f"{len(unexpected)} unexpected and {len(missing)} missing tensors: nearest-name "
                            f"suggestions for the first {SUGGEST_MAX} of each only")
    for i, n in enumerate(unexpected):
        ti = present[n]
        near = [renamed[n]] if n in renamed else []
        if not near and i < SUGGEST_MAX:
            near = [x for x in (miss_by.nearest(n),) if x]
        if not near and i < SUGGEST_MAX:
            near = [x for x in (exp_by.nearest(n),) if x]
        sug = cx.stored(near[0]) if near else None
        msg = f"{ti.source_name} ({ti.dtype} {list(ti.shape)}) is not a tensor of {a.family}"
        if near and near[0] in miss_names:
            msg += f"; misnamed? the expected {sug} is missing"
        elif near:
            msg += f"; nearest expected name: {sug}"
        cx.add("unexpected-tensor", "error", msg, tensor=ti.source_name, file=ti.file, suggestion=sug)
    unexp_by = N.NearIndex(unexpected)
    renamed_back = {m: u for u, m in renamed.items()}
    for i, e in enumerate(missing):
        near = [renamed_back[e.name]] if e.name in renamed_back else \
            [x for x in (unexp_by.nearest(e.name),) if x] if i < SUGGEST_MAX else []
        sug = present[near[0]].source_name if near else None
        msg = f"{cx.stored(e.name)} ({list(e.shape)}) is missing"
        if sug:
            msg += f"; a tensor named {sug} exists: misnamed?"
        cx.add("missing-tensor", "error", msg, tensor=cx.stored(e.name), layer=e.layer, suggestion=sug)

    # shapes, dtypes, quantization
    qc = ck.quant_config
    specs = Counter()
    nq = nf = 0
    for name, e in exp.items():
        ti = present.get(name)
        if ti is None:
            continue
        src, f = ti.source_name, ti.file
        if e.quantizable and name.endswith(".weight"):
            mod = e.module
            sc = present.get(mod + ".scales")
            bi = present.get(mod + ".biases")
            want = qc.expected(mod) if qc.present else None
            if sc is None and (mod + ".scales") in covered:
                continue
            if sc is None:
                nf += 1
                if ti.dtype == "U32" or ti.dtype not in _FLOATS:
                    cx.add("quantization-mismatch" if ti.dtype == "U32" else "dtype-mismatch", "error",
                           f"{src} is {ti.dtype} {list(ti.shape)} but has no {cx.stored(mod + '.scales')}"
                           if ti.dtype == "U32" else f"{src} is {ti.dtype}; expected a float dtype",
                           tensor=src, file=f)
                elif tuple(ti.shape) != e.shape:
                    _shape_problem(cx, ti, e.shape)
                continue
            nq += 1
            spec = infer(ti.shape, sc.shape, sc.dtype, e.shape[-1], want)
            if ti.dtype != "U32":
                cx.add("dtype-mismatch", "error", f"{src} has scales but is {ti.dtype}; a packed weight is U32",
                       tensor=src, file=f)
                continue
            if spec is None:
                if tuple(ti.shape[:-1]) != e.shape[:-1] or tuple(sc.shape[:-1]) != e.shape[:-1]:
                    for x in (ti, sc):
                        if tuple(x.shape[:-1]) != e.shape[:-1]:
                            _shape_problem(cx, x, e.shape[:-1] + tuple(x.shape[-1:]), quant=True)
                elif want is not None and (tuple(ti.shape) != want.packed_shape(e.shape)) != \
                        (tuple(sc.shape) != want.scales_shape(e.shape)):
                    x, shp = (ti, want.packed_shape(e.shape)) if tuple(ti.shape) != want.packed_shape(e.shape) \
                        else (sc, want.scales_shape(e.shape))
                    _shape_problem(cx, x, shp, quant=True)
                else:
                    cx.add("quantization-mismatch", "error",
                           f"{src} {list(ti.shape)} with scales {sc.dtype} {list(sc.shape)} fits no quantization "
                           f"mode for input width {e.shape[-1]}", tensor=src, file=f)
                continue
            specs[str(spec)] += 1
            if tuple(ti.shape) != spec.packed_shape(e.shape):
                _shape_problem(cx, ti, spec.packed_shape(e.shape), quant=True)
            if tuple(sc.shape) != spec.scales_shape(e.shape):
                _shape_problem(cx, sc, spec.scales_shape(e.shape), quant=True)
            if spec.mode == "affine":
                if sc.dtype not in _FLOATS:
                    cx.add("dtype-mismatch", "error", f"{sc.source_name} is {sc.dtype}; affine scales are float",
                           tensor=sc.source_name, file=sc.file)
                if bi is None:
                    cx.add("quantization-mismatch", "error", f"{src} is affine-quantized ({spec}) but "
                           f"{cx.stored(mod + '.biases')} is missing", tensor=src, file=f)
                elif tuple(bi.shape) != tuple(sc.shape):
                    _shape_problem(cx, bi, tuple(sc.shape), quant=True)
            elif bi is not None:
                cx.add("quantization-mismatch", "error", f"{bi.source_name}: {spec.mode} has no biases",
                       tensor=bi.source_name, file=bi.file)
            gsc = present.get(mod + ".global_scale")
            if gsc is not None:
                if spec.mode != "nvfp4":
                    cx.add("quantization-mismatch", "error", f"{gsc.source_name}: a global scale belongs to "
                           f"nvfp4, but {src} is {spec}", tensor=gsc.source_name, file=gsc.file)
                elif tuple(gsc.shape) != e.shape[:1] or gsc.dtype not in _FLOATS:
                    cx.add("shape-mismatch" if gsc.dtype in _FLOATS else "dtype-mismatch", "error",
                           f"{gsc.source_name} is {gsc.dtype} {list(gsc.shape)}; expected one float per expert "
                           f"{list(e.shape[:1])}", tensor=gsc.source_name, file=gsc.file)
            elif mod in qc.global_scale:
                cx.add("quantization-mismatch", "error", f"config.json asks for a global scale on {mod}, but "
                       f"{cx.stored(mod + '.global_scale')} is missing", tensor=src, file=f)
            if not qc.present:
                cx.add("quantization-mismatch", "error", f"{src} is quantized ({spec}) but config.json has no "
                       "quantization block", tensor=src, file=f)
            elif want is None:
                cx.add("quantization-mismatch", "error", f"{src} is quantized ({spec}) but config.json's "
                       f"quantization block keeps {mod} unquantized", tensor=src, file=f)
            elif spec != want:
                key = qc.override_keys.get(mod)
                src_cfg = f"override {key!r}" if key else "quantization block"
                cx.add("quantization-mismatch", "error",
                       f"{src} is packed as {spec} but config.json's {src_cfg} says {want} (mlx-lm infers the "
                       f"mode from shapes; an engine trusting config.json decodes garbage)", tensor=src, file=f)
            continue
        # plain tensors
        if ti.dtype not in _FLOATS:
            cx.add("dtype-mismatch", "error", f"{src} is {ti.dtype}; expected a float dtype (BF16/F16/F32)",
                   tensor=src, file=f)
        elif tuple(ti.shape) != e.shape:
            _shape_problem(cx, ti, e.shape)
    # scales / biases without a weight
    for n in present:
        if n.endswith((".scales", ".biases")) and n in quant_names and (n.rsplit(".", 1)[0] + ".weight") not in present \
                and (n.rsplit(".", 1)[0] + ".weight") not in covered:
            ti = present[n]
            cx.add("unexpected-tensor", "error", f"{ti.source_name} has no weight beside it",
                   tensor=ti.source_name, file=ti.file, suggestion=None)

    # quantization summary
    q = {"config": qc.to_dict(), "quantized_modules": nq, "float_modules": nf,
         "specs": dict(specs.most_common())}
    if qc.default:
        q.update(qc.default.to_dict())
    else:
        q.update({"mode": None, "bits": None, "group_size": None})
    report.quantization = q
    # MoE summary
    if a.moe:
        lays = sorted({e.layer for e in exp.values() if e.kind == "experts" and e.name in present} - {None})
        hf = any(ti.source_name.endswith(".gate_up_proj") for n, ti in present.items() if ".experts." in n)
        first = next((e for e in exp.values() if e.kind == "experts"), None)  # (any architecture's)
        eq = ck.quant_of(first.module) if lays and first else None
        report.moe = dict(a.moe, layout="fused gate_up_proj (Hugging Face)" if hf else "switch_glu (MLX)",
                          layers=len(lays), expert_quantization=str(eq) if eq else None,
                          router_quantization=str(ck.quant_of("layers.0.router.proj") or "") or None)
    _grid(report, a, present, {p.tensor for p in cx.problems if p.tensor}, cx)
    return a


_TOWER_LAYER = re.compile(r"^(.*?\blayers)\.(\d+)\.(.+)$")


def _check_towers(cx: _Ctx):
    """Vision / audio towers (and a language model of an unknown family) have no architecture
    table here; check that their layers are alike: a tensor that most layers of a stack hold but one layer lacks is reported
    (a warning: some towers mix block kinds)."""
    stacks = {}
    unknown_arch = cx.ck.arch is None  # then the language model gets the same check
    for name, ti in cx.ck.tensors.items():
        if ti.component == "language_model" and not unknown_arch:
            continue
        m = _TOWER_LAYER.match(name)
        if m:
            stacks.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = ti
    for stack, layers in stacks.items():
        if len(layers) < 3:
            continue
        counts = Counter(suf for lay in layers.values() for suf in lay)
        n = len(layers)
        for suf, c in sorted(counts.items()):
            if n - c == 0 or 3 * c < 2 * n:  # held by at least two thirds of the layers
                continue
            for i in sorted(layers):
                if suf not in layers[i]:
                    like = next(iter(layers[j][suf] for j in layers if suf in layers[j]))
                    cx.add("missing-tensor", "warning",
                           f"{stack}.{i}.{suf} is absent, but {c} of the {n} layers of {stack} hold it "
                           f"({like.dtype} {list(like.shape)})", tensor=f"{stack}.{i}.{suf}", layer=None)


def _rename_matches(unexpected, missing):
    """Pair unexpected names with missing ones that differ in exactly one dotted component
    (``layers`` -> ``blocks``, ``down_proj`` -> ``down_prj``) or by a leading prefix of one or
    two components (``transformer.``). Linear time: every name is indexed once per component.
    Returns ({unexpected: missing}, Counter({(expected_part, found_part): count}))."""
    rules = Counter()
    out = {}
    if not unexpected or not missing:
        return out, rules
    index = {}
    for m in missing:
        t = m.split(".")
        for i in range(len(t)):
            if not t[i].isdigit():
                index.setdefault((len(t), i, tuple(t[:i]), tuple(t[i + 1:])), []).append(m)
    full = set(missing)
    taken = set()
    for u in unexpected:
        t = u.split(".")
        hit = None
        for k in (1, 2):  # an extra leading prefix
            if len(t) > k and ".".join(t[k:]) in full:
                hit, rule = ".".join(t[k:]), ("", ".".join(t[:k]) + ".")
                break
        if hit is None:
            for i in range(len(t)):
                if t[i].isdigit():
                    continue
                c = index.get((len(t), i, tuple(t[:i]), tuple(t[i + 1:])))
                if c and len(c) == 1:
                    hit, rule = c[0], (c[0].split(".")[i], t[i])
                    break
        if hit is not None and hit not in taken:
            out[u] = hit
            taken.add(hit)
            rules[rule] += 1
    return out, rules


def _shape_problem(cx, ti, want, quant=False):
    got = tuple(ti.shape)
    hint = ""
    if len(got) == len(want) == 2 and got == tuple(reversed(want)):
        hint = " (stored transposed?)"
    cx.add("shape-mismatch", "error", f"{ti.source_name} has shape {list(got)}, expected {list(want)}"
           f"{' for its quantization' if quant else ''}{hint}", tensor=ti.source_name, file=ti.file)


_SHORT = [("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v"), ("self_attn.o_proj", "o"),
          ("self_attn.q_norm", "qn"), ("self_attn.k_norm", "kn"), ("mlp.gate_proj", "gate"), ("mlp.up_proj", "up"),
          ("mlp.down_proj", "down"), ("input_layernorm", "in"), ("post_attention_layernorm", "pa"),
          ("pre_feedforward_layernorm", "pf"), ("post_feedforward_layernorm", "pff"),
          ("router", "rt"), ("experts", "exp"), ("pre_feedforward_layernorm_2", "pf2"),
          ("post_feedforward_layernorm_1", "pff1"), ("post_feedforward_layernorm_2", "pff2"),
          ("per_layer_input_gate", "plg"), ("per_layer_projection", "plp"), ("post_per_layer_input_norm", "pln"),
          ("layer_scalar", "ls")]


def _column(rest: str) -> str:
    best = None
    for pre, short in _SHORT:
        if rest == pre or rest.startswith(pre + "."):
            if best is None or len(pre) > len(best[0]):
                best = (pre, short)
    return best[1] if best else rest.split(".")[0]


def _grid(report, a, present, bad_tensors, cx):
    cols = []
    rows = {}
    bad = set(bad_tensors)
    for e in a.expected.values():
        if e.layer is None:
            continue
        rest = e.name.split(".", 2)[2]
        c = _column(rest)
        if c not in cols:
            cols.append(c)
        row = rows.setdefault(e.layer, {})
        if e.name in present:
            stored = present[e.name].source_name
            st = "bad" if (stored in bad or any(cx.stored(e.module + s) in bad for s in (".scales", ".biases"))) \
                else "ok"
        elif e.optional:
            st = "absent-ok"
        else:
            st = "missing"
        prev = row.get(c)
        order = ["absent-ok", "ok", "bad", "missing"]
        if prev is None or order.index(st) > order.index(prev):
            if not (prev == "ok" and st == "absent-ok"):
                row[c] = st
    report.grid = {"columns": cols, "rows": rows}


# ---------------------------------------------------------------------- values
def _scan_values(cx: _Ctx, report: Report, progress, chunk_bytes):
    from workbench.checkpoint.values import ChunkReader, Stats

    ck = cx.ck
    # quantized weights: source name -> (spec, scales info, biases info)
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
            if spec.mode == "affine" and (bi is None or sc.dtype not in _FLOATS or bi.dtype not in _FLOATS):
                continue  # cannot be dequantized as stored (reported by the checks): raw values scanned
            if sc.source_name in ck.sfiles[sc.file].truncated or (bi and bi.source_name in ck.sfiles[bi.file].truncated):
                continue
            if (ti.shape[-1] * 32) % spec.bits or tuple(sc.shape[:-1]) != tuple(ti.shape[:-1]):
                continue
            if bi is not None and tuple(bi.shape) != tuple(sc.shape):
                continue
            qinfo[ti.source_name] = (spec, sc, bi)
    # uint8 scales of the microscaling modes are floats: E8M0 (mxfp4/8) or E4M3 (nvfp4)
    scale_fmt = {sc.source_name: ("E4M3" if spec.mode == "nvfp4" else "E8M0")
                 for spec, sc, bi in qinfo.values() if sc.dtype == "U8"}
    total = sum(ti.nbytes for ti in ck.tensors.values())
    bar = None
    if progress is None:
        progress = sys.stderr.isatty()
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="values", leave=False, file=sys.stderr)
        except ImportError:  # pragma: no cover
            bar = None
    stats = {}
    import collections
    import concurrent.futures as cf

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
    for name, e in failed.items():
        stats.pop(name, None)
        ti = ck.tensors[name]
        report.notes.append(f"values of {name} ({ti.file}, byte {ti.offset}) could not be computed: {e}")
    for name, s in stats.items():
        ti = ck.tensors[name]
        d = s.to_dict()
        bad = d["nan"] + d["posinf"] + d["neginf"]
        if bad and not _no_clip_bound(name, d):
            cx.add("nonfinite-values", "error",
                   f"{name} holds {d['nan']} NaN, {d['posinf']} +Inf, {d['neginf']} -Inf of {d['count']} values"
                   f"{' (after dequantization)' if name in qinfo else ''}", tensor=name, file=ti.file)
    return stats, qinfo


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
    import numpy as np

    from workbench.checkpoint.values import Stats, affine_stats, dequant_rows, native, pread, row_bytes, to_float

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


# ---------------------------------------------------------------------- entry
def inspect(path, values: bool = False, *, tensors: bool = False, progress=None,
            chunk_bytes: int | None = None) -> Report:
    """Inspect a checkpoint. Raises CheckpointError when the path cannot be read as one."""
    from workbench.checkpoint.values import CHUNK_BYTES

    ck = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    cx = _Ctx(ck)
    report = Report(path=str(ck.path), model_type=ck.model_type, num_layers=ck.num_layers,
                    components=dict(sorted(ck.components.items(), key=lambda kv: kv[0] != "language_model")),
                    quantization={}, moe=None, layout=ck.layout, files=list(ck.files),
                    total_bytes=sum(sf.size for sf in ck.sfiles.values()))
    if "language_model" not in report.components and ck.tensors:
        report.components = {"language_model": 0, **report.components}
    _check_arch(cx, report)
    _check_towers(cx)
    if not report.quantization:
        qc = ck.quant_config
        report.quantization = {"config": qc.to_dict(), **(qc.default.to_dict() if qc.default else
                                                          {"mode": None, "bits": None, "group_size": None})}
    stats = {}
    qinfo = {}
    if values:
        stats, qinfo = _scan_values(cx, report, progress, chunk_bytes or CHUNK_BYTES)
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


# ---------------------------------------------------------------------- render
def _fmt_bytes(n):
    for u in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or u == "TB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1024


def render(r: Report, color: bool = False) -> str:
    def c(s, code):
        return f"\x1b[{code}m{s}\x1b[0m" if color else s

    out = []
    nf = len(r.files)
    out.append(f"{r.path}")
    out.append(f"  model: {r.model_type}, {r.num_layers} layers, {r.layout.upper() if r.layout == 'hf' else r.layout} "
               f"name layout, {nf} file{'s' if nf != 1 else ''}, {_fmt_bytes(r.total_bytes)}")
    out.append("  components: " + ", ".join(f"{k} {v}" for k, v in r.components.items()))
    q = r.quantization or {}
    if q.get("specs"):
        parts = ", ".join(f"{k} x{v}" for k, v in q["specs"].items())
        cfgq = f"config: {q['mode']} {q['bits']}-bit g{q['group_size']}" if q.get("mode") else "config: none"
        out.append(f"  quantization: {q.get('quantized_modules', 0)} modules quantized ({parts}), "
                   f"{q.get('float_modules', 0)} float; {cfgq}")
        ov = (q.get("config") or {}).get("overrides") or {}
        if ov:
            kinds = Counter(_override_label(k, v) for k, v in ov.items())
            out.append("    overrides: " + "; ".join(f"{k} ({n})" for k, n in kinds.items()))
    else:
        out.append("  quantization: none" + (f" (config says {q['mode']} {q['bits']}-bit)" if q.get("mode") else ""))
    if r.moe:
        m = r.moe
        out.append(f"  MoE: {m['num_experts']} experts, top-{m.get('top_k')}, moe_intermediate_size "
                   f"{m['moe_intermediate_size']}, {m['layers']} layers, experts as {m['layout']}"
                   + (f", experts {m['expert_quantization']}" if m.get("expert_quantization") else "")
                   + (f", router {m['router_quantization']}" if m.get("router_quantization") else ""))
    if r.grid and r.grid["rows"]:
        cols = r.grid["columns"]
        sym = {"ok": c("✓", "32"), "missing": c("✗", "31;1"), "bad": c("!", "33;1"), "absent-ok": "·", None: " "}
        w = [max(len(x), 1) for x in cols]
        out.append("  layers x tensors (✓ present, · not needed, ✗ missing, ! wrong):")
        out.append("    " + " " * 12 + " ".join(x.rjust(wi) for x, wi in zip(cols, w)))
        rows = r.grid["rows"]
        keys = sorted(rows)
        i = 0
        while i < len(keys):
            j = i
            sig = tuple(rows[keys[i]].get(x) for x in cols)
            while j + 1 < len(keys) and tuple(rows[keys[j + 1]].get(x) for x in cols) == sig and \
                    keys[j + 1] == keys[j] + 1:
                j += 1
            lab = f"layer {keys[i]}" if i == j else f"layers {keys[i]}-{keys[j]}"
            out.append("    " + lab.ljust(12) + " ".join(sym[s].rjust(wi + (len(sym[s]) - 1 if color and s not in
                                                                             ("absent-ok", None) else 0))
                                                     for s, wi in zip(sig, w)))
            i = j + 1
    for n in r.notes[:5]:
        out.append(f"  note: {n}")
    if r.list_tensors and r.tensors:
        out.append(f"  tensors ({len(r.tensors)}):")
        for t in r.tensors:
            q = t.get("quantization")
            qs = f" {q['mode']} {q['bits']}-bit g{q['group_size']}" if q else ""
            line = f"    {t['name']}  {t['dtype']} {t['shape']}{qs}  {t['file']} @ {t['offset']}"
            st = t.get("stats")
            if st and st["min"] is not None:
                line += (f"  min {st['min']:.4g} max {st['max']:.4g} mean {st['mean']:.4g} std {st['std']:.4g}"
                         f" NaN {st['nan']} +Inf {st['posinf']} -Inf {st['neginf']} zeros {100 * st['zero_fraction']:.1f}%")
            elif st:
                line += f"  no finite values: NaN {st['nan']} +Inf {st['posinf']} -Inf {st['neginf']}"
            out.append(line)
    if r.tensors and any("stats" in t for t in r.tensors):
        scanned = [t for t in r.tensors if t.get("stats")]
        bad = [t for t in scanned if t["stats"]["nan"] + t["stats"]["posinf"] + t["stats"]["neginf"]]
        out.append(f"  values: {len(scanned)} tensors scanned, {len(bad)} with NaN/Inf"
                   + (" (quantized weights dequantized)" if any(t.get("dequantized") for t in scanned) else ""))
        fin = [t for t in scanned if t["stats"]["absmax"] is not None]
        show = bad[:20] + [t for t in sorted(fin, key=lambda t: -t["stats"]["absmax"]) if t not in bad][:3]
        if fin:
            zs = max(fin, key=lambda t: t["stats"]["zero_fraction"])
            if zs["stats"]["zero_fraction"] > 0.5 and zs not in show:
                show.append(zs)
        for t in show:
            s = t["stats"]
            rng = "no finite values" if s["min"] is None else \
                f"min {s['min']:.4g} max {s['max']:.4g} mean {s['mean']:.4g} std {s['std']:.4g}"
            out.append(f"    {t['name']}: {rng}; NaN {s['nan']}, +Inf {s['posinf']}, -Inf {s['neginf']}, "
                       f"zeros {100 * s['zero_fraction']:.1f}%")
        out.append("    (largest |values| shown; --json lists every tensor's statistics)")
    errs = [p for p in r.problems if p.severity == "error"]
    warns = [p for p in r.problems if p.severity != "error"]
    if r.problems:
        out.append(f"  problems: {len(errs)} error{'s' if len(errs) != 1 else ''}, "
                   f"{len(warns)} warning{'s' if len(warns) != 1 else ''}")
        per_kind = {}  # at most 10 lines per (severity, code), then a count: every kind stays visible
        for p in r.problems:
            per_kind.setdefault((p.severity, p.code), []).append(p)
        for (sev, code), ps in per_kind.items():
            tag = c("error  ", "31;1") if sev == "error" else c("warning", "33")
            for p in ps[:10]:
                out.append(f"    {tag} {code:<22} {p.message}")
                if p.suggestion and p.suggestion not in p.message:
                    out.append(f"            suggestion: {p.suggestion}")
            if len(ps) > 10:
                lays = sorted({p.layer for p in ps if p.layer is not None})
                where = f" (layers {lays[0]}-{lays[-1]})" if lays else ""
                out.append(f"    {tag} {code:<22} ... and {len(ps) - 10} more{where} (--json lists all)")
    out.append("  " + (c("OK: no errors", "32;1") if r.ok else c(f"FAILED: {len(errs)} error(s)", "31;1")))
    return "\n".join(out)


# ---------------------------------------------------------------------- diff
def diff(a, b, values: bool = False, progress=None) -> dict:
    """What differs between two checkpoints: names (canonical for the language model, as
    stored for other components), shapes, dtypes, quantization; with values, statistics."""
    cka = a if isinstance(a, Checkpoint) else open_checkpoint(a)
    ckb = b if isinstance(b, Checkpoint) else open_checkpoint(b)
    ra = inspect(cka, values=values, tensors=True, progress=progress)
    rb = inspect(ckb, values=values, tensors=True, progress=progress)

    def table(r, ck):
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

    ta, tb = table(ra, cka), table(rb, ckb)
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
            for f in ("nan", "posinf", "neginf"):
                if sx[f] != sy[f]:
                    changed[f] = [sx[f], sy[f]]
            for f in ("min", "max", "mean", "std", "absmax"):
                u, v = sx[f], sy[f]
                if (u is None) != (v is None) or (u is not None and not math.isclose(u, v, rel_tol=1e-3, abs_tol=1e-6)):
                    changed[f] = [u, v]
            if changed:
                vals.append({"tensor": k, "changed": changed})
    res = {"a": ra.path, "b": rb.path, "same": not (only_a or only_b or shape or dtype or quant or vals),
           "model_type": [ra.model_type, rb.model_type], "only_a": only_a, "only_b": only_b, "shape": shape,
           "dtype": dtype, "quantization": quant, "values": vals if values else None}
    return res


def render_diff(d: dict) -> str:
    out = [f"a: {d['a']}", f"b: {d['b']}"]
    if d["model_type"][0] != d["model_type"][1]:
        out.append(f"  model_type: {d['model_type'][0]} vs {d['model_type'][1]}")
    for key, lab in (("only_a", "only in a"), ("only_b", "only in b")):
        if d[key]:
            out.append(f"  {lab} ({len(d[key])}):")
            out += [f"    {n}" for n in d[key][:50]]
            if len(d[key]) > 50:
                out.append(f"    ... {len(d[key]) - 50} more")
    for key in ("shape", "dtype", "quantization"):
        if d[key]:
            out.append(f"  {key} differs ({len(d[key])}):")
            out += [f"    {x['tensor']}: {x['a']} vs {x['b']}" for x in d[key][:50]]
    if d.get("values"):
        out.append(f"  values differ ({len(d['values'])}):")
        for x in d["values"][:50]:
            ch = ", ".join(f"{k} {_g(v[0])} -> {_g(v[1])}" for k, v in x["changed"].items())
            out.append(f"    {x['tensor']}: {ch}")
    out.append("  same" if d["same"] else "  differ")
    return "\n".join(out)


def _override_label(k, v):
    k = re.sub(r"layers\.\d+\.", "layers.*.", k)
    if not v:
        return f"{k} -> float"
    return f"{k} -> {v.get('mode') or 'affine'} {v['bits']}-bit g{v['group_size']}"


def _g(v):
    return "None" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
