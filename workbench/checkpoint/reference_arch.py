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
* the reference's ``sanitize``, only where it changes what is expected: an ``lm_head``
  that sanitize drops (tied embeddings) may be present; and a checkpoint in a layout the
  reference converts when loading (the original Hugging Face names: per-expert weights it
  stacks, ...) is checked as sanitize converts it (:func:`check_layout`, run on
  placeholders), a tensor sanitize needs and does not find reported by its stored name.

Nothing real-size is allocated: the model is built with ``mx.random``'s initialisers
replaced by broadcast zeros (a view of one scalar, even if evaluated), and only the
parameters' ``shape`` / ``dtype`` are read.  Counts in the config are range-checked first,
so a hostile config cannot make the build loop for long.
"""
from __future__ import annotations

import contextlib
import math
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


class _Log(dict):
    """The weights dict handed to ``sanitize``: remembers which names each new name was
    made from (the names popped or read since the previous assignment)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.taken: list[str] = []
        self.made: dict[str, list[str]] = {}

    def pop(self, k, *default):
        if k in self:
            self.taken.append(k)
        return super().pop(k, *default)

    def __getitem__(self, k):
        v = super().__getitem__(k)
        self.taken.append(k)
        return v

    def __setitem__(self, k, v):
        self.made[k] = self.taken
        self.taken = []
        super().__setitem__(k, v)


@dataclass
class Layout:
    """How the reference's ``sanitize`` reads a checkpoint's language-model tensors."""
    consumed: dict = field(default_factory=dict)  # stored name -> canonical names made from it
    produced: dict = field(default_factory=dict)  # canonical name -> (float shape, [stored names])
    error: str | None = None                      # why sanitize failed
    missing: str | None = None                    # the stored name it needed and did not find
    errors: list = field(default_factory=list)    # (error, missing) of every failing layer

    @property
    def changed(self) -> bool:
        return bool(self.produced) or self.error is not None


def sanitized_layout(config: Mapping, stored: Mapping) -> Layout:
    """Run the reference's ``sanitize`` over placeholders of a checkpoint's language-model
    tensors (``stored``: name as stored -> (shape, safetensors dtype)) and report which
    stored names it turns into which model names: the original Hugging Face layouts it
    converts (per-expert weights stacked, fused projections split, ...).  Placeholders are
    broadcast scalars: nothing real-size is read or allocated.

    When sanitize fails on the whole checkpoint, it is run again layer by layer (with the
    tensors outside layers and layer 0's, which some sanitizes test for): the failing
    layers' errors are kept, and their tensors are taken as the other layers' were."""
    try:
        lib, name, model = build_model(config)
    except ConfigError:
        return Layout()
    if not hasattr(model, "sanitize"):
        return Layout()
    who = f"{lib.replace('_', '-')}'s {name}"
    import mlx.core as mx

    ph = {n: _zeros(shape, getattr(mx, _PLACEHOLDER_DTYPES.get(dtype, "float32")))
          for n, (shape, dtype) in stored.items()}
    out = _sanitize_once(model, ph, who)
    if out.error is None:
        return out
    by_layer: dict = {}
    for s in stored:
        by_layer.setdefault(N.layer_of(s), []).append(s)
    base = by_layer.pop(None, [])
    if not by_layer or len(by_layer) > MAX_LAYERS:
        return out
    first = min(by_layer)
    if len(by_layer) * (len(base) + len(by_layer[first])) > SANITIZE_BUDGET:
        return out
    merged, failed = Layout(), {}
    for i in sorted(by_layer):
        names = base + by_layer[first] + (by_layer[i] if i != first else [])
        part = _sanitize_once(model, {s: ph[s] for s in names}, who)
        if part.error is not None:
            failed[i] = part
            continue
        for canon, (shape, srcs) in part.produced.items():
            if i == first or N.layer_of(canon) == i:
                merged.produced[canon] = (shape, srcs)
        for src, made in part.consumed.items():
            if i == first or N.layer_of(src) == i:
                merged.consumed[src] = made
    if not failed or len(failed) == len(by_layer):
        return out
    # a failing layer's tensors: those named like the converted ones of the other layers
    pat = lambda n: _LAYER_NUM.sub(".layers.#.", "." + n)  # noqa: E731
    conv = {pat(s) for s in merged.consumed}
    made = {pat(c): (shape, srcs) for c, (shape, srcs) in merged.produced.items()}
    for i, part in sorted(failed.items()):
        for s in by_layer[i]:
            if pat(s) in conv:
                merged.consumed.setdefault(s, [])
        for p_, (shape, srcs) in made.items():
            canon = p_.replace(".layers.#.", f".layers.{i}.", 1)[1:]
            merged.produced.setdefault(canon, (None, []))
        if merged.error is None:
            merged.error, merged.missing = part.error, part.missing
        odd = None
        if part.missing is None:  # the tensor whose shape differs from the first layer's same-named one
            ref = {pat(s): stored[s][0] for s in by_layer[first]}
            odd = next((s for s in by_layer[i] if pat(s) in ref and tuple(stored[s][0]) != tuple(ref[pat(s)])), None)
            if odd is not None:
                part.error = (f"{odd} has shape {list(stored[odd][0])}, but layer {first}'s has "
                              f"{list(ref[pat(odd)])}; {part.error}")
        merged.errors.append((part.error, part.missing, odd))
    return merged


_LAYER_NUM = __import__("re").compile(r"\.layers\.\d+\.")


#: placeholders handed to sanitize, at most, when it is run again layer by layer
SANITIZE_BUDGET = 2_000_000


def _sanitize_once(model, stored: Mapping, who: str) -> Layout:
    """One sanitize run over ``stored`` (name -> placeholder array, kept alive by the
    caller: no new array can reuse a placeholder's id)."""
    out = Layout()
    ph = _Log(stored)
    ident = {id(v): k for k, v in stored.items()}
    try:
        res = model.sanitize(ph)
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
        return out
    made = ph.made if res is ph else {}
    for k, v in dict.items(res) if isinstance(res, dict) else res.items():
        src = ident.get(id(v))
        if src == k:
            continue  # kept as stored
        sources = [src] if src is not None else [s for s in made.get(k, []) if s in stored and s not in res]
        cands = N.canonical(k)
        if not cands or not sources:
            continue
        canon = cands[0][0]
        out.produced[canon] = (tuple(int(s) for s in v.shape), sources)
        for s in sources:
            out.consumed.setdefault(s, []).append(canon)
    dropped = [s for s in stored if s not in res and s not in out.consumed]
    for s in dropped:  # read by sanitize and not kept (precomputed tables, unused heads)
        out.consumed.setdefault(s, [])
    return out


@dataclass
class LayoutCheck:
    """What inspect takes from :func:`check_layout`."""
    consumed: set = field(default_factory=set)    # canonical names of stored tensors sanitize converts
    produced: set = field(default_factory=set)    # expected canonical names sanitize makes from them
    problems: list = field(default_factory=list)  # (code, message, stored tensor name)
    notes: list = field(default_factory=list)


def check_layout(config: Mapping, expected: Mapping, present: Mapping) -> LayoutCheck:
    """Check a checkpoint in a layout the reference converts when loading (the original
    Hugging Face names of an architecture with no table here) against the expected tensors
    *after* the reference's ``sanitize``.  ``present``: canonical name -> info with
    ``source_name``, ``shape``, ``dtype`` (the reader's TensorInfo)."""
    by_src = {}
    for canon, ti in present.items():
        by_src.setdefault(ti.source_name, (canon, ti))
    lay = sanitized_layout(config, {s: (tuple(ti.shape), ti.dtype) for s, (_, ti) in by_src.items()})
    out = LayoutCheck()
    for error, missing, odd in lay.errors or ([(lay.error, lay.missing, None)] if lay.error else []):
        out.problems.append(("missing-tensor" if missing else "shape-mismatch",
                             error + ("" if missing or odd else ": a tensor has the wrong shape?"), missing or odd))
    if not lay.produced:
        return out
    for src, made in lay.consumed.items():
        out.consumed.add(by_src[src][0])
    for canon, (shape, srcs) in lay.produced.items():
        e = expected.get(canon)
        floats = all(by_src[s][1].dtype in ("F32", "F16", "BF16") for s in srcs)
        if e is None:
            if not canon.endswith((".scales", ".biases")):
                out.problems.append(("unexpected-tensor", f"{', '.join(srcs[:3])}{' ...' if len(srcs) > 3 else ''} "
                                     f"become {canon}, which is not a tensor of this model", srcs[0]))
            continue
        out.produced.add(canon)
        if shape is not None and floats and tuple(shape) != tuple(e.shape):
            out.problems.append(("shape-mismatch", f"{', '.join(srcs[:3])}{' ...' if len(srcs) > 3 else ''} become "
                                 f"{canon} of shape {list(shape)}, expected {list(e.shape)}", srcs[0]))
    out.notes.append(f"{len(lay.consumed)} tensors are in a layout the reference converts when loading "
                     f"(original Hugging Face names): checked as its sanitize converts them "
                     f"into {len(lay.produced)} tensors")
    return out
