"""Expected tensors of any architecture, read from the reference model class itself.

For a model type with no hand-written table in :mod:`workbench.checkpoint.arch`, the
reference that :func:`workbench.registry.reference_for` picks (mlx-lm's
``mlx_lm.models.<name>``, or mlx-vlm's for a checkpoint with towers) builds its ``Model``
from config.json as its loader reads it (:mod:`workbench.checkpoint.reference_config`), and
the model's parameter tree is the list of
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
  ``sanitize`` (:func:`workbench.checkpoint.sanitize_layout.check_layout`, run on
  placeholders of the stored tensors: the
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
from typing import Mapping

from dataclasses import dataclass, field

from workbench import registry
from workbench.checkpoint import corrections
from workbench.checkpoint import names as N
from workbench.checkpoint import reference_config
from workbench.errors import ConfigError  # (the reference cannot build a model from this config.json)


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


#: infinities that mean "no bound" where the original reads them: Mamba 2's time_step_limit
#: upper bound (transformers' default (0.0, inf), as Mamba-Codestral publishes it; a clip to inf
#: is no clip, in transformers and in mlx-lm alike)
_INF_OK = {"time_step_limit.1": math.inf}


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
            if isinstance(v, float) and not math.isfinite(v) and not (key in _INF_OK and v == _INF_OK[key]):
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


def zeros(shape, dtype):
    """Broadcast zeros of ``shape`` (one scalar, whatever the shape): a placeholder tensor."""
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
            zeros(_shape_of(shape, low, high), dtype),
        "normal": lambda shape=None, dtype=mx.float32, loc=0.0, scale=1.0, key=None, stream=None:
            zeros(_shape_of(shape, loc, scale), dtype),
        "truncated_normal": lambda lower, upper, shape=None, dtype=mx.float32, key=None, stream=None:
            zeros(_shape_of(shape, lower, upper), dtype),
        "laplace": lambda shape=None, dtype=mx.float32, loc=0.0, scale=1.0, key=None, stream=None:
            zeros(shape, dtype),
        "gumbel": lambda shape=None, dtype=mx.float32, key=None, stream=None: zeros(shape, dtype),
        "bernoulli": lambda p=0.5, shape=None, key=None, stream=None: zeros(_shape_of(shape, p), mx.bool_),
        "randint": lambda low, high, shape=None, dtype=mx.int32, key=None, stream=None:
            zeros(_shape_of(shape, low, high), dtype),
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
    except registry.Departs as e:
        raise ConfigError(f"config.json: {e}") from None
    except ValueError:
        raise ConfigError(f"config.json: model_type {config.get('model_type')!r} is not a supported family: "
                          "neither mlx-lm nor mlx-vlm builds it, and workbench has no table for it "
                          f"({', '.join(sorted(registry.TABLE_FAMILIES))})") from None
    _check_numbers(config)
    # (the config as the reference reads it: the same normalising as loading)
    cfg = reference_config.normalise(config, lib, name).config
    who = f"{lib.replace('_', '-')}'s {name}"
    try:
        mod = registry.import_reference(lib, name)
        args_cls = mod.ModelArgs if lib == "mlx_lm" else mod.ModelConfig
        _check_types(cfg, args_cls, who)
        with no_allocation() if placeholders else contextlib.nullcontext():
            model = mod.Model(args_cls.from_dict(cfg)) if lib == "mlx_lm" else _build_vlm(mod, cfg)
        if lib == "mlx_lm":  # what loading corrects in mlx-lm's model, or refuses (ConfigError), as loading does
            corrections.correct(model, name, config)
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


def check_config(config: Mapping, library: str, name: str) -> None:
    """What :func:`build_model` refuses in a config before building, for a loader that builds
    by itself (``workbench.load`` at module level): a number implausibly large, a value of
    the wrong JSON type for a field the reference reads.  ConfigError, in the sentence
    inspect reports."""
    _check_numbers(config)
    cfg = reference_config.normalise(config, library, name).config
    mod = registry.import_reference(library, name)
    _check_types(cfg, mod.ModelArgs if library == "mlx_lm" else mod.ModelConfig,
                 f"{library.replace('_', '-')}'s {name}")


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
