"""A checkpoint's tensors as the reference's own ``sanitize`` converts them, on placeholders.
(~500 lines, kept whole: one path, placeholders -> sanitize -> provenance -> repairs -> check.)

mlx-lm and mlx-vlm convert, while loading, the layouts they were written for: DeepSeek's
``kv_b_proj`` split into ``embed_q`` / ``unembed_out``, per-expert weights stacked, fused
ones split, conv kernels and GPT-2's Conv1D weights transposed, scalars reshaped.  To say
what a checkpoint lacks as loading would see it, :func:`check_layout` runs that sanitize
on placeholders of the stored tensors (broadcast zeros of their shapes and dtypes: nothing
real-size is allocated), after :mod:`workbench.checkpoint.layouts`' conversions, and reads
which stored tensors each converted tensor is made from off MLX's graph
(``mx.export_to_dot``, which evaluates nothing).  A sanitize that fails is explained: a
tensor it needs (filled in from its siblings, then reported missing), one shaped unlike its
siblings, a gap in numbered tensors it skips.  Every problem is named by the stored tensor.

reference_arch.py builds the reference model whose parameters are the expected tensors;
checks.py calls :func:`check_layout`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from workbench.checkpoint import names as N
from workbench.checkpoint.reference_arch import MAX_LAYERS, ConfigError, build_model, zeros

#: safetensors dtype -> mlx dtype name of a placeholder (FP8 as the bytes it is stored in)
_PLACEHOLDER_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float32", "U32": "uint32",
                       "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "I32": "int32",
                       "I64": "int64", "U64": "uint64", "BOOL": "bool_", "F8_E4M3": "uint8", "F8_E5M2": "uint8",
                       "F8_E8M0": "uint8"}
#: mlx dtype name -> safetensors dtype of a tensor sanitize computes
_STORED_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "uint8": "U8",
                  "int8": "I8", "uint16": "U16", "int16": "I16", "int32": "I32", "int64": "I64", "uint64": "U64",
                  "bool": "BOOL", "float64": "F64"}

#: placeholders handed to sanitize, at most, when it is run again (repairs, layer by layer)
SANITIZE_BUDGET = 2_000_000
#: tensors tried in turn to explain a sanitize that fails (a missing one filled, a mis-shaped one fixed)
MAX_REPAIRS = 16

_DIGITS = re.compile(r"(?<=\.)\d+(?=\.)")
_LAYER_NUM = re.compile(r"\.layers\.\d+\.")


def _pattern(name: str) -> str:
    """``model.layers.3.mlp.experts.7.w1.weight`` -> ``model.layers.#.mlp.experts.#.w1.weight``."""
    return _DIGITS.sub("#", "." + name + ".")[1:-1]


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in name.split(".")]


def placeholder(shape, dtype):
    """A stand-in for a stored tensor of ``shape`` and safetensors ``dtype``: broadcast zeros,
    nothing real-size allocated."""
    import mlx.core as mx

    return zeros(shape, getattr(mx, _PLACEHOLDER_DTYPES.get(dtype, "float32")))


@dataclass
class Layout:
    """How the reference's ``sanitize`` reads a checkpoint's language-model tensors: what it
    keeps, what it makes (converted, stacked, split, renamed) from which stored tensors."""
    consumed: dict = field(default_factory=dict)  # stored name -> canonical names made from it ([]: dropped)
    produced: dict = field(default_factory=dict)  # canonical name -> (shape, [stored names], stored dtype)
    error: str | None = None                      # why sanitize failed
    missing: str | None = None                    # the stored name it needed and did not find
    errors: list = field(default_factory=list)    # (error, missing, odd) of every failing layer
    repairs: list = field(default_factory=list)   # (code, message, stored name): what made sanitize fail
    ran: bool = False                             # sanitize was run (the config builds, the model has one)

    @property
    def changed(self) -> bool:
        return bool(self.produced) or bool(self.consumed) or self.error is not None


#: arrays named in one ``mx.export_to_dot`` call (it takes at most 1024 keyword arguments)
_DOT_NAMES = 1000


def _group(name: str):
    """The first numbered part of a name (``layers.3``, ``h.3``): which layer it belongs to."""
    t = name.split(".")
    return next(((t[i - 1], t[i]) for i in range(1, len(t)) if t[i].isdigit()), None)


def _reach(outs: list, ins: list) -> dict:
    """One graph export: output name -> the names of ``ins`` among its ancestors
    (``outs``, ``ins``: [(name, array)], at most _DOT_NAMES together)."""
    import io

    import mlx.core as mx

    named = {f"o_{j}": v for j, (_, v) in enumerate(outs)}
    iname = {}
    for j, (n, v) in enumerate(ins):
        named[f"i_{j}"] = v
        iname[f"i_{j}"] = n
    buf = io.StringIO()
    mx.export_to_dot(buf, **named)
    producer, args = {}, {}
    for line in buf.getvalue().splitlines():
        a, arrow, b = line.partition("->")
        if not arrow:
            continue
        a, b = a.strip(), b.strip()
        if a.startswith('"'):
            args.setdefault(b, []).append(a.strip('"'))
        else:
            producer[b.strip('"')] = a
    out = {}
    for j, (oname, _) in enumerate(outs):
        seen, found, todo = set(), [], [f"o_{j}"]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in iname:
                found.append(iname[n])
                continue
            todo.extend(args.get(producer.get(n), ()))
        out[oname] = found
    return out


def _provenance(outputs: Mapping, inputs: Mapping) -> dict:
    """The stored names each computed array of ``outputs`` (key -> array) is made from:
    the placeholders of ``inputs`` (stored name -> placeholder) among its ancestors in
    MLX's graph (read through ``mx.export_to_dot``; nothing is evaluated).  Each output
    is looked for among the inputs of its own layer and those outside layers first, then,
    if none is found, among all."""
    if not outputs:
        return {}
    uniq: dict = {}
    for k, v in outputs.items():
        uniq.setdefault(id(v), (k, v, []))[2].append(k)
    in_by: dict = {}
    for n, v in inputs.items():
        if id(v) not in uniq:
            in_by.setdefault(_group(n), []).append((n, v))
    out_by: dict = {}
    for k, v, keys in uniq.values():
        out_by.setdefault(_group(k), []).append((k, v))
    found: dict = {}

    def search(outs, ins):
        step_o = max(1, _DOT_NAMES // 4)
        for a in range(0, len(outs), step_o):
            o = outs[a:a + step_o]
            step_i = _DOT_NAMES - len(o)
            for b in range(0, max(len(ins), 1), step_i):
                for k, srcs in _reach(o, ins[b:b + step_i]).items():
                    found.setdefault(k, []).extend(srcs)

    for g, outs in out_by.items():
        search(outs, in_by.get(g, []) + (in_by.get(None, []) if g is not None else []))
    lost = [(k, v) for k, v, _ in uniq.values() if not found.get(k)]
    if lost:
        search(lost, [(n, v) for ins in in_by.values() for n, v in ins])
    res = {}
    for k, v, keys in uniq.values():
        srcs = sorted(set(found.get(k, ())), key=_natural)
        for key in keys:
            res[key] = srcs
    return res


def _sanitize_once(model, ph: Mapping, who: str, stored: Mapping) -> Layout:
    """One sanitize run over ``ph`` (name -> placeholder, kept alive by the caller: no new
    array can reuse a placeholder's id); ``stored``: stored name -> (shape, dtype) (``ph``
    may hold placeholders for names not stored, filled in to make sanitize run)."""
    out = Layout(ran=True)
    try:
        res = model.sanitize(_converted(model, dict(ph)))
    except KeyError as e:
        out.missing = str(e.args[0]) if e.args else None
        out.error = f"{who}'s sanitize needs {out.missing!r} to convert this checkpoint's layout"
        return out
    except Exception as e:  # noqa: BLE001 - a sanitize that cannot take this checkpoint
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        out.error = f"{who}'s sanitize cannot convert this checkpoint's layout ({type(e).__name__}" \
                    f"{': ' + msg if msg else ''})"
        return out
    if not isinstance(res, Mapping):
        return Layout()
    ident = {id(v): k for k, v in ph.items()}
    kept, computed = set(), {}
    for k, v in res.items():
        if not isinstance(k, str) or not hasattr(v, "shape"):
            continue
        src = ident.get(id(v))
        if src == k:
            kept.add(k)
        elif N.canonical(k):
            computed[k] = (v, src)
    prov = _provenance({k: v for k, (v, src) in computed.items() if src is None}, ph)
    for k, (v, src) in computed.items():
        srcs = [src] if src is not None else prov.get(k, [])
        canon = N.canonical(k)[0][0]
        dts = {stored[s][1] for s in srcs if s in stored}
        dt = _STORED_DTYPES.get(str(v.dtype).rpartition(".")[2], str(v.dtype))
        if len(dts) == 1 and _PLACEHOLDER_DTYPES.get(next(iter(dts))) == str(v.dtype).rpartition(".")[2]:
            dt = next(iter(dts))  # (as stored: FP8 stays FP8, F64 stays F64)
        srcs = [s for s in srcs if s in stored]  # (not the placeholders filled in for missing ones)
        out.produced[canon] = (tuple(int(s) for s in v.shape), srcs, dt)
        for s in srcs:
            out.consumed.setdefault(s, []).append(canon)
    for s in ph:
        if s not in kept and s not in out.consumed and s in stored:  # dropped (precomputed tables, unused heads)
            out.consumed[s] = []
    return out


def _converted(model, weights: dict) -> dict:
    """``weights`` in the layout the reference's own sanitize reads, as loading converts them
    (checkpoint/layouts.py: names and transposes transformers writes differently)."""
    try:
        from workbench.checkpoint import layouts
    except ImportError:  # pragma: no cover
        return weights
    family = type(model).__module__.rpartition(".")[2]
    return layouts.convert(family, weights)


def _siblings(stored: Mapping) -> dict:
    """pattern -> stored names of that pattern (numbers generalised), in natural order."""
    out: dict = {}
    for s in stored:
        out.setdefault(_pattern(s), []).append(s)
    for v in out.values():
        v.sort(key=_natural)
    return out


def _odd_shapes(stored: Mapping, sibs: dict):
    """(stored name, its siblings' shape, that sibling): tensors whose shape differs from
    tensors of the same pattern; the minority first, then ties (the later name first)."""
    from collections import Counter

    strict, ties = [], []
    for names in sibs.values():
        if len(names) < 2:
            continue
        counts = Counter(tuple(stored[n][0]) for n in names)
        if len(counts) < 2:
            continue
        (top, c1), (_, c2) = counts.most_common(2)
        sib = next(n for n in names if tuple(stored[n][0]) == top)
        for n in reversed(names):
            shape = tuple(stored[n][0])
            if shape == top:
                if c1 == c2:  # a tie: either may be the odd one
                    other = next(m for m in names if tuple(stored[m][0]) != top)
                    ties.append((n, tuple(stored[other][0]), other))
                continue
            (ties if c1 == counts[shape] else strict).append((n, top, sib))
    return strict + ties


def _repair(model, ph, stored, lay: Layout, who: str) -> Layout | None:
    """A sanitize that fails on the checkpoint, made to run by filling the tensor it needs
    with a placeholder shaped like its siblings, or by giving a tensor whose shape differs
    from its siblings' their shape; each repair is a problem naming the stored tensor.
    None when no repair makes it run."""
    sibs = _siblings(stored)
    cur, filled, fixes = dict(ph), set(), []
    spent = 0
    for _ in range(MAX_REPAIRS):
        if lay.error is None:
            break
        m = lay.missing
        if m is not None and m not in cur:
            like = sibs.get(_pattern(m))
            if not like:
                return None
            cur[m] = placeholder(*stored[like[0]])
            filled.add(m)
            fixes.append(("missing-tensor", f"{m} is missing: {lay.error}", m))
            lay = _sanitize_once(model, cur, who, stored)
            spent += len(cur)
            continue
        for n, shape, sib in _odd_shapes({s: stored[s] for s in stored if s not in filled}, sibs)[:MAX_REPAIRS]:
            if spent > SANITIZE_BUDGET:
                return None
            trial = dict(cur)
            trial[n] = placeholder(shape, stored[n][1])
            t = _sanitize_once(model, trial, who, stored)
            spent += len(trial)
            if t.error != lay.error:
                fixes.append(("shape-mismatch", f"{n} has shape {list(stored[n][0])}, but {sib} has "
                                                f"{list(shape)}; {lay.error}", n))
                cur, lay = trial, t
                break
        else:
            return None
    if lay.error is not None:
        return None
    lay.repairs = fixes
    return lay


def _fill_holes(model, ph, stored, lay: Layout, who: str, expected=None, tries: int = 0) -> Layout:
    """Stored tensors sanitize leaves as they are (and the model does not have: not in
    ``expected``), numbered with a gap (``experts.1`` to ``experts.3`` without ``experts.0``,
    layer 1's fused experts without layer 0's, which its test for the layout looks for):
    when, the gap filled with a placeholder shaped like its siblings, sanitize converts
    more of them, the gap is a missing tensor."""
    kept = [s for s in ph if s in stored and s not in lay.consumed]
    left = [s for s in kept if expected is None or (N.canonical(s) or [(s, None)])[0][0] not in expected]
    holes = {}
    for s in left:
        toks = s.split(".")
        for i, t in enumerate(toks):
            if t.isdigit() and i:
                key = (tuple(toks[:i]), tuple(toks[i + 1:]))
                holes.setdefault(key, set()).add(int(t))
    for (pre, post), idx in sorted(holes.items()):
        gap = [g for g in sorted(set(range(max(idx) + 1)) - idx) if ".".join(pre + (str(g),) + post) not in ph]
        if not gap or tries >= MAX_REPAIRS:
            continue
        tries += 1
        m = ".".join(pre + (str(gap[0]),) + post)
        like = ".".join(pre + (str(min(idx)),) + post)
        cur = dict(ph)
        cur[m] = placeholder(*stored[like])
        t = _sanitize_once(model, cur, who, stored)
        if t.error is None and sum(1 for s in ph if s in stored and s not in t.consumed) < len(kept):
            t.repairs = lay.repairs + [("missing-tensor", f"{m} is missing: its siblings {like} ... are stored, "
                                        f"and {who}'s sanitize converts them only with it", m)]
            return _fill_holes(model, cur, stored, t, who, expected, tries) if tries < MAX_REPAIRS else t
    return lay


def sanitized_layout(config: Mapping, stored: Mapping, expected=None) -> Layout:
    """Run the reference's ``sanitize`` over placeholders of a checkpoint's language-model
    tensors (``stored``: name as stored -> (shape, safetensors dtype); ``expected``: the
    model's canonical tensor names, when known) and report which
    stored names it turns into which model names: the original Hugging Face layouts it
    converts (per-expert weights stacked, fused projections split, Conv1D and conv
    kernels transposed, ...).  Placeholders are broadcast scalars: nothing real-size is
    read or allocated; what each made tensor comes from is read from MLX's graph.

    When sanitize fails on the checkpoint, the tensor that makes it fail is looked for
    (one it needs and does not find, one shaped unlike its siblings: ``repairs``); failing
    that, it is run again layer by layer (with the tensors outside layers and layer 0's,
    which some sanitizes test for): the failing layers' errors are kept, and their tensors
    are taken as the other layers' were."""
    try:
        lib, name, model = build_model(config)
    except ConfigError:
        return Layout()
    if not hasattr(model, "sanitize"):
        return Layout()
    who = f"{lib.replace('_', '-')}'s {name}"
    ph = {n: placeholder(shape, dtype) for n, (shape, dtype) in stored.items()}
    out = _sanitize_once(model, ph, who, stored)
    if out.error is None:
        return _fill_holes(model, ph, stored, out, who, expected)
    fixed = _repair(model, ph, stored, out, who)
    if fixed is not None:
        return fixed
    by_layer: dict = {}
    for s in stored:
        by_layer.setdefault(N.layer_of(s), []).append(s)
    base = by_layer.pop(None, [])
    if not by_layer or len(by_layer) > MAX_LAYERS:
        return out
    first = min(by_layer)
    if len(by_layer) * (len(base) + len(by_layer[first])) > SANITIZE_BUDGET:
        return out
    merged, failed = Layout(ran=True), {}
    for i in sorted(by_layer):
        names = base + by_layer[first] + (by_layer[i] if i != first else [])
        part = _sanitize_once(model, {s: ph[s] for s in names}, who, stored)
        if part.error is not None:
            failed[i] = part
            continue
        for canon, made in part.produced.items():
            if i == first or N.layer_of(canon) == i:
                merged.produced[canon] = made
        for src, made in part.consumed.items():
            if i == first or N.layer_of(src) == i:
                merged.consumed[src] = made
    if not failed or len(failed) == len(by_layer):
        return out
    # a failing layer's tensors: those named like the converted ones of the other layers
    pat = lambda n: _LAYER_NUM.sub(".layers.#.", "." + n)  # noqa: E731
    conv = {pat(s) for s in merged.consumed}
    made = {pat(c) for c in merged.produced}
    for i, part in sorted(failed.items()):
        for s in by_layer[i]:
            if pat(s) in conv:
                merged.consumed.setdefault(s, [])
        for p_ in made:
            canon = p_.replace(".layers.#.", f".layers.{i}.", 1)[1:]
            merged.produced.setdefault(canon, (None, [], None))
        if merged.error is None:
            merged.error, merged.missing = part.error, part.missing
        merged.errors.append((part.error, part.missing, None))
    return merged


@dataclass
class LayoutCheck:
    """What inspect takes from :func:`check_layout`: the language-model tensors as the
    reference's loader hands them to the model (after its ``sanitize``)."""
    present: dict = field(default_factory=dict)    # canonical name -> TensorInfo, after sanitize
    made: dict = field(default_factory=dict)       # canonical name -> [stored names] sanitize made it from
    made_from: dict = field(default_factory=dict)  # expected canonical name -> the stored name it is made from
    assumed: set = field(default_factory=set)      # canonical names taken as made (a layer sanitize fails on)
    problems: list = field(default_factory=list)   # (code, message, stored tensor name)
    notes: list = field(default_factory=list)
    failed: bool = False                           # sanitize fails on this checkpoint, and no repair explains why


def check_layout(config: Mapping, expected: Mapping, present: Mapping) -> LayoutCheck:
    """The checkpoint's language-model tensors as the reference's loader sees them: its
    ``sanitize`` run over placeholders of the stored tensors (the original Hugging Face
    layouts it converts), the result to be checked against the expected tensors (the
    model's parameters).  ``present``: canonical name -> info with ``source_name``,
    ``shape``, ``dtype``, ``part`` (the reader's TensorInfo).

    A tensor sanitize makes keeps the name it is stored under (``source_name``: the first
    stored tensor it is made from) and gets the shape and dtype sanitize gives it; an
    expected tensor that sanitize makes in other layers and not in this one is named by
    the stored tensor it would be made from (``made_from``)."""
    import dataclasses

    by_src: dict = {}
    for canon, ti in present.items():
        by_src.setdefault(ti.source_name, ti)

    def full(ti):  # a fused half's whole stored tensor
        if ti.part and len(ti.shape) >= 2:
            return tuple(ti.shape[:-2]) + (2 * ti.shape[-2], ti.shape[-1])
        return tuple(ti.shape)

    stored = {s: (full(ti), ti.dtype) for s, ti in by_src.items()}
    lay = sanitized_layout(config, stored, expected)
    out = LayoutCheck(present=dict(present))
    if not lay.ran:
        return out
    for code, msg, tensor in lay.repairs:
        out.problems.append((code, msg, tensor))
    if lay.error is not None and not lay.produced and not lay.consumed:
        out.failed = True
        out.problems.append(("missing-tensor" if lay.missing else "shape-mismatch",
                             lay.error + ("" if lay.missing else ": a tensor has the wrong shape?"), lay.missing))
        return out
    for error, missing, odd in lay.errors:
        out.problems.append(("missing-tensor" if missing else "shape-mismatch",
                             error + ("" if missing or odd else ": a tensor has the wrong shape?"), missing or odd))
    view = {c: ti for c, ti in present.items() if ti.source_name not in lay.consumed}
    for canon, (shape, srcs, dt) in lay.produced.items():
        if shape is None or not srcs:
            out.assumed.add(canon)
            continue
        ti = by_src[srcs[0]]
        view[canon] = dataclasses.replace(ti, name=canon, shape=tuple(shape), dtype=dt, part=None)
        out.made[canon] = list(srcs)
    out.present = view
    out.made_from = _made_from(expected, view, out.made, stored)
    if lay.consumed:
        out.notes.append(f"{len(lay.consumed)} tensors are in a layout the reference converts when loading "
                         f"(original Hugging Face names): checked as its sanitize converts them "
                         f"into {len(out.made)} tensors")
    return out


def _swap_numbers(name: str, old: str, new: str) -> str:
    """``name`` with the numbers of ``old`` (each after its own word: ``layers.1``) replaced
    by ``new``'s."""
    a, b = old.split("."), new.split(".")
    swap = {a[i - 1]: (a[i], b[i]) for i in range(1, len(a)) if a[i].isdigit() and a[i] != b[i]}
    t = name.split(".")
    for i in range(1, len(t)):
        w = swap.get(t[i - 1])
        if w and t[i] == w[0]:
            t[i] = w[1]
    return ".".join(t)


def _made_from(expected: Mapping, view: Mapping, made: Mapping, stored: Mapping) -> dict:
    """Expected tensors sanitize did not make, but makes elsewhere (another layer): the
    stored tensor it would make them from, the first of them not stored."""
    by_pat: dict = {}
    for canon in made:
        by_pat.setdefault(_pattern(canon), canon)
    out = {}
    for name in expected:
        if name in view:
            continue
        like = by_pat.get(_pattern(name))
        if like is None:
            continue
        cands = [_swap_numbers(s, like, name) for s in made[like]]
        out[name] = next((c for c in cands if c not in stored), cands[0])
    return out
