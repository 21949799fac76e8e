"""The inspector's checks: what the config asks for against what the checkpoint holds.

``check_arch`` (language model: missing / unexpected / misnamed tensors, shapes, dtypes,
quantization, MoE summary, the layers x tensors grid) and ``check_towers`` (vision / audio
towers and unknown families: layers that lack what their siblings hold); misnamed.py pairs
unexpected tensors with the missing ones they are. Each adds
:class:`~workbench.checkpoint.reader.Problem` s to a :class:`Context`.
"""
from __future__ import annotations

import re
from collections import Counter

from workbench import registry
from workbench.checkpoint import names as N
from workbench.checkpoint.misnamed import made_from, report_misnamed
from workbench.checkpoint.quant import infer
from workbench.checkpoint.reader import Checkpoint, Problem
from workbench.checkpoint.sanitize_layout import check_layout

#: dtypes a float tensor (and affine scales / biases) may have
FLOATS = {"BF16", "F16", "F32"}


class Context:
    """The checkpoint under inspection and the problems found so far; ``stored(canonical)``
    spells a canonical name the way this checkpoint stores it."""

    def __init__(self, ck: Checkpoint):
        self.ck = ck
        self.problems: list[Problem] = list(ck.problems)
        # how this checkpoint spells LM names: canonical -> stored prefix
        pre = Counter()
        for cn, ti in ck.canonical.items():
            if ti.source_name.endswith(cn):
                pre[ti.source_name[: len(ti.source_name) - len(cn)]] += 1
        self.prefix = pre.most_common(1)[0][0] if pre else ("model." if ck.config else "")
        # a family with no table: what the reference's sanitize makes from which stored tensors
        self.made: dict[str, list[str]] = {}       # canonical name -> stored names it is made from
        self.made_from: dict[str, str] = {}        # expected canonical name -> the stored one it would be made from
        self.mis_shaped: set = set()               # stored tensors whose made tensors were reported mis-shaped

    def stored(self, canon: str) -> str:
        made = self.made.get(canon) or ([self.made_from[canon]] if canon in self.made_from else None)
        if made:
            return made[0]
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


def check_arch(cx: Context, report):
    """Every tensor the config asks for, against what the checkpoint holds: missing and
    unexpected (misnamed?) tensors, shapes, dtypes, quantization; fills the report's
    quantization and MoE summaries and its layers x tensors grid. Returns the Arch or None."""
    ck = cx.ck
    a = ck.arch
    if a is None:
        _report_no_arch(cx)
        return None
    present = {n: ck.canonical[n] for n in ck.lm_names()}
    covered, blind = _covered_names(ck)
    quant_names = _quant_names(a.modules())
    present = _as_loaded(cx, report, a.expected, present, quant_names, covered)
    unexpected, missing, miss_names = _unexpected_and_missing(cx, report, a.expected, present, quant_names,
                                                              covered, blind)
    report_misnamed(cx, report, a, present, unexpected, missing, miss_names)
    specs, n_quantized, n_float = _check_tensors(cx, a.expected, present, covered)
    _check_orphan_quant_tensors(cx, present, quant_names, covered)
    report.quantization = quant_summary(ck.quant_config, n_quantized, n_float, specs)
    if a.moe:
        report.moe = _moe_summary(ck, a, present)
    _grid(report, a, present, {p.tensor for p in cx.problems if p.tensor}, cx)
    return a


def _report_no_arch(cx: Context):
    """No architecture table: a config.json we cannot read is named, an error: whatever
    ``workbench.load`` cannot build from (an unknown ``model_type`` included) is never
    vouched for."""
    err = cx.ck.arch_error
    if cx.ck.config_present and err:
        cx.add("bad-config", "error", err + "; completeness not checked", file="config.json")


def _covered_names(ck):
    """Canonical names whose tensors lie in unreadable or missing shards (their files are
    reported, the tensors are not "missing"), and whether such a shard leaves us blind (no
    index to say what it held)."""
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
    return covered, bool(unknown_files) and not ck.index


def _quant_names(modules) -> set:
    """The quantization companions any module may carry (scales, biases; a global scale on experts)."""
    quant_names = set()
    for mod, e in modules.items():
        quant_names.update({mod + ".scales", mod + ".biases"})
        if e.kind == "experts":  # nvfp4 switch layers may carry one tensor scale per expert
            quant_names.add(mod + ".global_scale")
    return quant_names


def _as_loaded(cx, report, exp, present, quant_names, covered):
    """A family with no table (expected tensors from the reference model): the checkpoint's
    tensors as the reference's loader hands them to the model, after its ``sanitize`` (the
    original Hugging Face layouts it converts: per-expert weights stacked, fused ones split,
    kernels transposed, ...), named by the stored tensors they are made from.  ``covered``
    gains what a failing sanitize leaves unknown."""
    ck = cx.ck
    if registry.table_family(ck.config) is not None:
        return present
    lay = check_layout(ck.config, exp, present)
    if lay.failed and all(n in exp or n in quant_names for n in present):
        return present  # sanitize fails on a checkpoint with nothing to convert: checked as it is stored
    for code, msg, tensor in lay.problems:
        cx.add(code, "error", msg, tensor=tensor)
    report.notes.extend(lay.notes)
    covered.update(lay.assumed)
    cx.made, cx.made_from = lay.made, lay.made_from
    return lay.present


def _unexpected_and_missing(cx, report, exp, present, quant_names, covered, blind):
    """(unexpected names, missing expected tensors, missing names incl. their scales/biases)."""
    ck = cx.ck
    unexpected = [n for n in present if n not in exp and n not in quant_names]
    missing = [e for e in exp.values() if not e.optional and e.name not in present and e.name not in covered]
    if blind:
        missing = []
        report.notes.append("a shard's header is unreadable and there is no index: missing tensors not listed")
    miss_names = [e.name for e in missing]
    for e in missing:
        if e.quantizable and e.name.endswith(".weight") and ck.quant_config.present:
            miss_names += [e.module + ".scales", e.module + ".biases"]
    return unexpected, missing, miss_names


def _check_tensors(cx, exp, present, covered):
    """Shapes, dtypes and quantization of every expected tensor present. Returns
    (Counter of quantization specs, quantized modules, float modules)."""
    specs = Counter()
    n_quantized = n_float = 0
    for name, e in exp.items():
        ti = present.get(name)
        if ti is None:
            continue
        if e.quantizable and name.endswith(".weight"):
            kind = _check_quantizable_weight(cx, e, ti, present, covered, specs)
            n_quantized += kind == "quantized"
            n_float += kind == "float"
        elif ti.dtype not in FLOATS:  # plain tensors
            cx.add("dtype-mismatch", "error", f"{ti.source_name} is {ti.dtype}; expected a float dtype "
                   "(BF16/F16/F32)", tensor=ti.source_name, file=ti.file)
        elif tuple(ti.shape) != e.shape:
            _shape_problem(cx, ti, e.shape)
    return specs, n_quantized, n_float


def _check_quantizable_weight(cx, e, ti, present, covered, specs):
    """A weight that may be quantized: "float" (no scales), "quantized" (counted, its spec in
    ``specs`` when one fits) or None (its scales lie in an unreadable shard)."""
    qc = cx.ck.quant_config
    src, f = ti.source_name, ti.file
    mod = e.module
    sc = present.get(mod + ".scales")
    want = qc.expected(mod) if qc.present else None
    if sc is None and (mod + ".scales") in covered:
        return None
    if sc is None:
        if ti.dtype == "U32" or ti.dtype not in FLOATS:
            cx.add("quantization-mismatch" if ti.dtype == "U32" else "dtype-mismatch", "error",
                   f"{src} is {ti.dtype} {list(ti.shape)} but has no {cx.stored(mod + '.scales')}"
                   if ti.dtype == "U32" else f"{src} is {ti.dtype}; expected a float dtype",
                   tensor=src, file=f)
        elif tuple(ti.shape) != e.shape:
            _shape_problem(cx, ti, e.shape)
        return "float"
    spec = infer(ti.shape, sc.shape, sc.dtype, e.shape[-1], want)
    if ti.dtype != "U32":
        cx.add("dtype-mismatch", "error", f"{src} has scales but is {ti.dtype}; a packed weight is U32",
               tensor=src, file=f)
    elif spec is None:
        _report_no_quant_fit(cx, e, ti, sc, want)
    else:
        specs[str(spec)] += 1
        _check_quant_spec(cx, e, ti, sc, present, spec, want)
    return "quantized"


def _report_no_quant_fit(cx, e, ti, sc, want):
    """A packed weight and scales that fit no quantization mode: the wrong shape, or no mode."""
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
               f"{ti.source_name} {list(ti.shape)} with scales {sc.dtype} {list(sc.shape)} fits no quantization "
               f"mode for input width {e.shape[-1]}", tensor=ti.source_name, file=ti.file)


def _check_quant_spec(cx, e, ti, sc, present, spec, want):
    """A packed weight whose shapes fit ``spec``: companion shapes and dtypes (biases, global
    scale), and the spec against what config.json says."""
    qc = cx.ck.quant_config
    src, f, mod = ti.source_name, ti.file, e.module
    bi = present.get(mod + ".biases")
    if tuple(ti.shape) != spec.packed_shape(e.shape):
        _shape_problem(cx, ti, spec.packed_shape(e.shape), quant=True)
    if tuple(sc.shape) != spec.scales_shape(e.shape):
        _shape_problem(cx, sc, spec.scales_shape(e.shape), quant=True)
    if spec.mode == "affine":
        if sc.dtype not in FLOATS:
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
        elif tuple(gsc.shape) != e.shape[:1] or gsc.dtype not in FLOATS:
            cx.add("shape-mismatch" if gsc.dtype in FLOATS else "dtype-mismatch", "error",
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


def _check_orphan_quant_tensors(cx, present, quant_names, covered):
    """Scales / biases without a weight beside them."""
    for n in present:
        if n.endswith((".scales", ".biases")) and n in quant_names and (n.rsplit(".", 1)[0] + ".weight") not in present \
                and (n.rsplit(".", 1)[0] + ".weight") not in covered:
            ti = present[n]
            cx.add("unexpected-tensor", "error", f"{ti.source_name} has no weight beside it",
                   tensor=ti.source_name, file=ti.file, suggestion=None)


def quant_summary(qc, n_quantized=0, n_float=0, specs=None) -> dict:
    """The report's ``quantization`` block: config.json's, its default spec, and (after the
    checks) how many modules are quantized with which spec."""
    q = {"config": qc.to_dict()}
    if specs is not None:
        q.update({"quantized_modules": n_quantized, "float_modules": n_float, "specs": dict(specs.most_common())})
    q.update(qc.default.to_dict() if qc.default else {"mode": None, "bits": None, "group_size": None})
    return q


def _moe_summary(ck, a, present) -> dict:
    exp = a.expected
    lays = sorted({e.layer for e in exp.values() if e.kind == "experts" and e.name in present} - {None})
    hf = any(ti.source_name.endswith(".gate_up_proj") for n, ti in present.items() if ".experts." in n)
    first = next((e for e in exp.values() if e.kind == "experts"), None)  # (any architecture's)
    eq = ck.quant_of(first.module) if lays and first else None
    return dict(a.moe, layout="fused gate_up_proj (Hugging Face)" if hf else "switch_glu (MLX)",
                layers=len(lays), expert_quantization=str(eq) if eq else None,
                router_quantization=str(ck.quant_of("layers.0.router.proj") or "") or None)


_TOWER_LAYER = re.compile(r"^(.*?\blayers)\.(\d+)\.(.+)$")


def check_towers(cx: Context):
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


def _shape_problem(cx, ti, want, quant=False):
    got = tuple(ti.shape)
    hint = ""
    if len(got) == len(want) == 2 and got == tuple(reversed(want)):
        hint = " (stored transposed?)"
    what = f"{ti.source_name} has shape {list(got)}"
    if ti.name in cx.made:  # made by the reference's sanitize
        if (ti.source_name, quant) in cx.mis_shaped:  # (one stored tensor, several made: said once)
            return
        cx.mis_shaped.add((ti.source_name, quant))
        what = f"{made_from(cx, ti.name)} {'become' if len(cx.made[ti.name]) > 1 else 'becomes'} {ti.name} of " \
               f"shape {list(got)} (the reference's sanitize converts {'them' if len(cx.made[ti.name]) > 1 else 'it'})"
    cx.add("shape-mismatch", "error", f"{what}, expected {list(want)}"
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


