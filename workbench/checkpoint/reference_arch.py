"""Expected tensors of any architecture, read from the reference model class itself.

For a model type with no hand-written table in :mod:`workbench.checkpoint.arch`, the
reference that :func:`workbench.registry.reference_for` picks (mlx-lm's
``mlx_lm.models.<name>``, or mlx-vlm's for a checkpoint with towers) builds its ``Model``
from config.json exactly as its loader does, and the model's parameter tree is the list of
tensors a sound checkpoint holds:

* names: the parameter paths, canonicalised like checkpoint names (names.py strips the
  language-model prefix: ``model.layers.0.self_attn.q_proj.weight`` ->
  ``layers.0.self_attn.q_proj.weight``); tower parameters are not language-model tensors;
* shapes: the parameters' shapes, the float shapes (quantization is applied on top by
  inspect, as for the hand-written tables);
* quantizable: the weight of every module that has ``to_quantized`` (what mlx-lm's loader
  quantizes when the checkpoint holds its ``.scales``), so quant.py's checks apply;
* the reference's ``sanitize``: an ``lm_head`` that sanitize drops (tied embeddings) may be
  present; and the checkpoint is checked as the reference's loader reads it, after its
  ``sanitize`` (:func:`check_layout`, run on placeholders of the stored tensors: the
  layouts it converts, per-expert weights stacked, fused ones split, kernels and Conv1D
  weights transposed, MLA's ``kv_b_proj`` split, ...), every problem named by the stored
  tensor: a tensor sanitize makes by the one it is made from, a tensor it needs and does
  not find, or one it cannot take (shaped unlike its siblings), by its stored name.

Nothing real-size is allocated: the model is built with ``mx.random``'s initialisers
replaced by broadcast zeros (a view of one scalar, even if evaluated), and only the
parameters' ``shape`` / ``dtype`` are read.  Counts in the config are range-checked first,
so a hostile config cannot make the build loop for long.
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Mapping

from dataclasses import dataclass, field

from workbench import registry
from workbench.checkpoint import names as N
from workbench.checkpoint import reference_config


class ConfigError(ValueError):
    """The reference cannot build a model from this config.json (message names why);
    arch.py reports it as its own ConfigError (bad-config)."""


@dataclass
class Tensor:
    name: str                  # canonical language-model name
    shape: tuple               # float shape
    kind: str                  # linear | embedding | experts | norm | vector | scalar | tensor
    layer: int | None = None
    optional: bool = False
    ignored_if_present: bool = False


@dataclass
class Reference:
    """What the reference model says a checkpoint of this config holds."""
    library: str               # mlx_lm | mlx_vlm
    family: str                # the reference module's name (model_type after remapping)
    num_layers: int
    tensors: dict = field(default_factory=dict)   # canonical name -> Tensor
    moe: dict | None = None    # {"num_experts", "top_k", "moe_intermediate_size"} of a mixture of experts

    @property
    def tied(self) -> bool:
        t = self.tensors.get("lm_head.weight")
        return t is None or t.optional

    def add(self, name, shape, kind, layer=None, **kw):
        self.tensors[name] = Tensor(name, tuple(int(s) for s in shape), kind, layer, **kw)

#: refused before building: larger counts describe no real model (the largest released ones
#: have a few hundred layers) and would take long to build (~2 ms a layer)
MAX_LAYERS = 1_000
MAX_EXPERTS = 100_000
MAX_DIM = 1 << 31
_LAYER_KEYS = ("layers", "n_layer", "num_blocks", "depth")
_EXPERT_KEYS = ("experts",)


def _check_numbers(d, where="", depth=0):
    """Range-check every integer in the config (nested sections included)."""
    if depth > 8:
        return
    items = d.items() if isinstance(d, Mapping) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        key = f"{where}.{k}" if where else str(k)
        if isinstance(v, (Mapping, list)):
            if isinstance(v, list) and len(v) > 4 * MAX_LAYERS:
                raise ConfigError(f"config.json: {key} lists {len(v)} entries: implausibly long")
            _check_numbers(v, key, depth + 1)
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"config.json: field {key!r} is {v}, not a finite number")
            continue
        name = str(k).lower()
        cap = MAX_DIM
        if isinstance(k, str) and any(s in name for s in _LAYER_KEYS):
            cap = MAX_LAYERS
        elif isinstance(k, str) and any(s in name for s in _EXPERT_KEYS):
            cap = MAX_EXPERTS
        if abs(v) > cap:
            raise ConfigError(f"config.json: field {key!r} = {v} is implausibly large (at most {cap})")


def _zeros(shape, dtype):
    import mlx.core as mx

    shape = () if shape is None else tuple(int(s) for s in (shape if isinstance(shape, (list, tuple)) else [shape]))
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {list(shape)}")
    return mx.broadcast_to(mx.array(0, dtype=dtype or mx.float32), shape)


def _shape_of(shape, *operands):
    import mlx.core as mx

    if shape is not None:
        return shape
    arrs = [o for o in operands if isinstance(o, mx.array)]
    return mx.broadcast_shapes(*[a.shape for a in arrs]) if arrs else ()


@contextlib.contextmanager
def no_allocation():
    """``mx.random``'s initialisers return broadcast zeros while building a model: its
    parameters then cost one scalar each, even if something evaluates them, and the
    global random state is left as it was."""
    import mlx.core as mx

    r = mx.random
    fakes = {
        "uniform": lambda low=0.0, high=1.0, shape=None, dtype=mx.float32, key=None, stream=None:
            _zeros(_shape_of(shape, low, high), dtype),
        "normal": lambda shape=None, dtype=mx.float32, loc=0.0, scale=1.0, key=None, stream=None:
            _zeros(_shape_of(shape, loc, scale), dtype),
        "truncated_normal": lambda lower, upper, shape=None, dtype=mx.float32, key=None, stream=None:
            _zeros(_shape_of(shape, lower, upper), dtype),
        "laplace": lambda shape=None, dtype=mx.float32, loc=0.0, scale=1.0, key=None, stream=None:
            _zeros(shape, dtype),
        "gumbel": lambda shape=None, dtype=mx.float32, key=None, stream=None: _zeros(shape, dtype),
        "bernoulli": lambda p=0.5, shape=None, key=None, stream=None: _zeros(_shape_of(shape, p), mx.bool_),
        "randint": lambda low, high, shape=None, dtype=mx.int32, key=None, stream=None:
            _zeros(_shape_of(shape, low, high), dtype),
    }
    saved = {k: getattr(r, k) for k in fakes}
    try:
        for k, f in fakes.items():
            setattr(r, k, f)
        yield
    finally:
        for k, f in saved.items():
            setattr(r, k, f)


def build_model(config: Mapping, library: str | None = None, *, placeholders: bool = True):
    """(library, module name, model): the reference's ``Model`` for a config.json dict,
    built as its loader builds it, with nothing real-size allocated (``placeholders=False``:
    its own random initialisation, to write a tiny checkpoint).  Raises ConfigError."""
    if not isinstance(config, Mapping):
        raise ConfigError("config.json is not a JSON object")
    try:
        lib, name = registry.reference_for(config, library)
    except registry.MissingExtra as e:
        raise ConfigError(f"config.json: model_type {config.get('model_type')!r} is not a supported family "
                          f"without mlx-vlm ({e})") from None
    except ValueError:
        raise ConfigError(f"config.json: model_type {config.get('model_type')!r} is not a supported family: "
                          "neither mlx-lm nor mlx-vlm builds it, and workbench has no table for it "
                          f"({', '.join(sorted(registry.TABLE_FAMILIES))})") from None
    _check_numbers(config)
    try:  # (the config as the reference reads it: the same normalising as loading)
        cfg = reference_config.normalise(config, lib, name).config
    except reference_config.ConfigError as e:
        raise ConfigError(str(e)) from None
    who = f"{lib.replace('_', '-')}'s {name}"
    try:
        mod = registry.import_reference(lib, name)
        args_cls = mod.ModelArgs if lib == "mlx_lm" else mod.ModelConfig
        _check_types(cfg, args_cls, who)
        with no_allocation() if placeholders else contextlib.nullcontext():
            model = mod.Model(args_cls.from_dict(cfg)) if lib == "mlx_lm" else _build_vlm(mod, cfg)
    except ConfigError:
        raise
    except registry.MissingExtra:
        raise  # (the reference library cannot be used at all: unusable input, not a finding)
    except RecursionError:
        raise ConfigError(f"config.json: {who} cannot build a model from it (nested too deeply)") from None
    except Exception as e:  # noqa: BLE001 - any failure of the reference on this config is a bad config
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        raise ConfigError(f"config.json: {who} cannot build a model from it ({type(e).__name__}"
                          f"{': ' + msg if msg else ''}){_suspects(cfg, args_cls)}") from None
    return lib, name, model


def _suspects(cfg: dict, args_cls) -> str:
    """The config's numbers a constructor most likely failed on: counts at zero or below,
    and fractions in fields the reference reads as integers."""
    import dataclasses
    import typing

    try:
        hints = typing.get_type_hints(args_cls) if dataclasses.is_dataclass(args_cls) else {}
    except Exception:  # noqa: BLE001
        hints = {}
    out = []
    for k, v in cfg.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if v <= 0:
            out.append(f"{k}={v}")
        elif isinstance(v, float) and hints.get(k) is int and not v.is_integer():
            out.append(f"{k}={v} (read as an integer)")
    return f"; suspect fields: {', '.join(out[:6])}" if out else ""


def _fits(v, t):
    """Does config value ``v`` fit a numeric type annotation ``t`` (``int``, ``float``,
    optionally ``Optional``)?  None for any other annotation: the references annotate
    loosely (an ``eos_token_id`` may be a number or a list), so only numbers are checked."""
    import typing

    args = typing.get_args(t)
    if typing.get_origin(t) is typing.Union or type(t).__name__ == "UnionType":
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or inner[0] not in (int, float):
            return None
        return v is None if type(None) in args and v is None else _fits(v, inner[0])
    if v is None:  # (null: the references annotate some optional fields int and test for None,
        return None  # deepseek_v2's q_lora_rank; one that does not fails to build, named then)
    if t in (int, float):  # (mlx-lm annotates some float fields int: any number is let through)
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return None


def _check_types(cfg: dict, args_cls, who: str) -> None:
    """A config value of the wrong JSON type for the field the reference reads is named
    (rather than surfacing as an arithmetic error deep in its constructor)."""
    import dataclasses
    import json
    import typing

    if not dataclasses.is_dataclass(args_cls):
        return
    try:
        hints = typing.get_type_hints(args_cls)
    except Exception:  # noqa: BLE001 - unresolvable annotations: nothing to check against
        return
    for f in dataclasses.fields(args_cls):
        if f.name in cfg and _fits(cfg[f.name], hints.get(f.name)) is False:
            t = hints.get(f.name)
            tn = getattr(t, "__name__", None) or str(t).replace("typing.", "")
            raise ConfigError(f"config.json: field {f.name!r} is {json.dumps(cfg[f.name])[:60]}, but {who} "
                              f"reads it as {tn}")


def _build_vlm(mod, cfg):
    """mlx-vlm's ``load_model`` up to the model's construction (its config plumbing)."""
    from mlx_vlm.utils import update_module_configs

    cfg.setdefault("text_config", cfg.pop("llm_config", {}))
    cfg.setdefault("vision_config", {})
    cfg.setdefault("audio_config", {})
    mc = mod.ModelConfig.from_dict(cfg)
    mc = update_module_configs(mc, mod, cfg, ["text", "vision", "perceiver", "projector", "audio"])
    return mod.Model(mc)


def _kind(mod, leaf: str, shape: tuple) -> str:
    if leaf == "weight" and hasattr(mod, "to_quantized"):
        if len(shape) == 3 and "switch" in type(mod).__name__.lower():  # stacked experts (SwitchLinear)
            return "experts"
        return "embedding" if "embedding" in type(mod).__name__.lower() else "linear"
    if len(shape) == 0 or shape == (1,):
        return "scalar"
    if len(shape) == 1:
        return "norm" if "norm" in type(mod).__name__.lower() else "vector"
    return "tensor"


def reference_tensors(config: Mapping, library: str | None = None) -> Reference:
    """The expected language-model tensors of ``config``, from the reference's own model
    class.  Raises ConfigError."""
    from mlx.utils import tree_flatten

    lib, name, model = build_model(config, library)
    mods = dict(model.named_modules())
    params = tree_flatten(model.parameters())
    tc = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    a = Reference(lib, name, 0)
    for path, v in params:
        cands = N.canonical(path)
        if not cands:  # a tower or projector parameter
            continue
        canon = cands[0][0]
        shape = tuple(int(s) for s in v.shape)
        mpath, _, leaf = path.rpartition(".")
        kind = _kind(mods.get(mpath), leaf, shape)
        a.add(canon, shape, kind, N.layer_of(canon))
    a.moe = _moe(a, tc)
    layers = [t.layer for t in a.tensors.values() if t.layer is not None]
    a.num_layers = max(layers) + 1 if layers else _num_layers(tc)
    _sanitize_knowledge(a, model, params)
    return a


#: config keys naming the experts a token is routed to, across the references
_TOP_K_KEYS = ("num_experts_per_tok", "top_k_experts", "moe_top_k", "top_k", "num_selected_experts")


def _moe(a: Reference, tc) -> dict | None:
    """Experts count and width from the first stacked-experts weight: [E, out, in], where
    the projection back to the hidden size has out = hidden."""
    first = next((t for t in a.tensors.values() if t.kind == "experts"), None)
    if first is None:
        return None
    emb = a.tensors.get("embed_tokens.weight")
    hidden = emb.shape[-1] if emb else None
    width = None
    for t in a.tensors.values():
        if t.kind == "experts" and t.layer == first.layer and hidden in t.shape[1:]:
            width = t.shape[2] if t.shape[1] == hidden else t.shape[1]
            break
    top_k = next((tc[k] for k in _TOP_K_KEYS if isinstance(tc.get(k), int) and not isinstance(tc.get(k), bool)),
                 None)
    return {"num_experts": first.shape[0], "top_k": top_k, "moe_intermediate_size": width}


def _num_layers(tc) -> int:
    for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
        v = tc.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return 0


def _sanitize_knowledge(a: Reference, model, params) -> None:
    """What the reference's ``sanitize`` adds to the list: an ``lm_head`` it drops when the
    embeddings are tied may be present (and is not used)."""
    emb = a.tensors.get("embed_tokens.weight")
    if "lm_head.weight" in a.tensors or emb is None or not hasattr(model, "sanitize"):
        return
    names = dict(params)
    probe = next((p[: -len("embed_tokens.weight")] for p in names if p.endswith("embed_tokens.weight")), "")
    head = probe.replace("model.", "", 1) if probe.startswith("model.") else probe
    key = head + "lm_head.weight"
    names[key] = names[probe + "embed_tokens.weight"]
    try:
        out = model.sanitize(dict(names))
    except Exception:  # noqa: BLE001 - a sanitize that cannot take the probe says nothing
        return
    if isinstance(out, Mapping) and key not in out:
        a.add("lm_head.weight", emb.shape, "linear", optional=True, ignored_if_present=True)


# ---------------------------------------------------------------------- layouts the reference converts
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


def _placeholder(shape, dtype):
    import mlx.core as mx

    return _zeros(shape, getattr(mx, _PLACEHOLDER_DTYPES.get(dtype, "float32")))


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
            cur[m] = _placeholder(*stored[like[0]])
            filled.add(m)
            fixes.append(("missing-tensor", f"{m} is missing: {lay.error}", m))
            lay = _sanitize_once(model, cur, who, stored)
            spent += len(cur)
            continue
        for n, shape, sib in _odd_shapes({s: stored[s] for s in stored if s not in filled}, sibs)[:MAX_REPAIRS]:
            if spent > SANITIZE_BUDGET:
                return None
            trial = dict(cur)
            trial[n] = _placeholder(shape, stored[n][1])
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
        cur[m] = _placeholder(*stored[like])
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
    ph = {n: _placeholder(shape, dtype) for n, (shape, dtype) in stored.items()}
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
