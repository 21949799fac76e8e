"""config.json of a multimodal checkpoint, in every form it is written, into what mlx-vlm reads.

mlx-vlm builds a Gemma 3 / Gemma 4 model from config.json through its dataclasses
(``ModelConfig``, ``TextConfig``, ``VisionConfig``, ``AudioConfig``): a field the config
lacks silently takes mlx-vlm's default, a key no field reads is silently dropped.
Configs written by transformers 5 differ from the ones mlx-vlm was written against:

* token ids under ``*_token_index`` (Gemma 4's ``eoa_token_index``) where mlx-vlm reads
  ``*_token_id`` (and the other way round: Gemma 3's ``image_token_index``);
* Gemma 4's full-attention head size and KV heads in ``per_layer_config`` (layer index ->
  overrides), where mlx-vlm reads ``global_head_dim`` / ``num_global_key_value_heads``;
* Gemma 3's layer pattern in ``layer_types`` and its RoPE in ``rope_parameters`` per layer
  type, where mlx-vlm reads ``sliding_window_pattern``, ``rope_global_base_freq``,
  ``rope_local_base_freq`` and ``rope_scaling`` (and ``mm_tokens_per_image`` at the top,
  where mlx-vlm reads it in text_config);
* defaults that differ: a key the config leaves out takes transformers' value (its own
  config class reads the config; no torch), not mlx-vlm's (Gemma 4: ``final_logit_softcapping``,
  ``use_double_wide_mlp``, ``num_kv_shared_layers``, the layer pattern; Gemma 3: the
  sliding window).

:func:`normalise_vlm` returns a deep copy in mlx-vlm's form.  A key mlx-vlm does not read
is accepted only when it cannot change the numbers (provenance, training settings, or
the one value mlx-vlm's code implements); anything else is refused with one line naming
the key (:class:`VLMConfigError`, a ValueError).  Families other than Gemma 3 and Gemma 4
pass through unchanged.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
from typing import Mapping

from workbench.checkpoint.reference_config import COMMON_IGNORED, equal, original_config, show
from workbench.errors import ConfigError


#: config.json holds something mlx-vlm would silently get wrong (the message names it): the one
#: ConfigError (workbench.errors), under the name this module has always raised
VLMConfigError = ConfigError


#: never change the numbers of a forward (besides COMMON_IGNORED)
IGNORED = COMMON_IGNORED | frozenset({
    "tie_word_embeddings", "ignore_index", "initializer_factor", "vision_use_head", "video_token_id",
    "boi_token_id", "eoi_token_id", "boa_token_id", "eoa_token_id", "boi_token_index", "eoi_token_index",
    "boa_token_index", "eoa_token_index", "image_token_id", "audio_token_id", "vision_soft_tokens_per_image",
    "vision_soft_tokens_per_video_frame", "audio_soft_tokens_per_image", "audio_ms_per_token",
    "max_position_embeddings", "gradient_clipping",
})

#: (family, part) -> {key mlx-vlm does not read: the values its code implements}
NEUTRAL: dict[tuple[str, str], dict[str, tuple]] = {
    ("gemma3", "text"): {"attention_bias": (False,), "attn_logit_softcapping": (None,),
                         "final_logit_softcapping": (None,), "use_bidirectional_attention": (False, None),
                         "hidden_activation": ("gelu_pytorch_tanh",), "hidden_act": ("gelu_pytorch_tanh",)},
    ("gemma3", "vision"): {"hidden_act": ("gelu_pytorch_tanh",)},
    ("gemma4", "text"): {"attention_bias": (False,), "hidden_activation": ("gelu_pytorch_tanh",)},
    ("gemma4", "vision"): {"attention_bias": (False,), "hidden_activation": ("gelu_pytorch_tanh",)},
    ("gemma4", "audio"): {"hidden_act": ("silu",)},
}

#: keys this module turns into mlx-vlm's fields (accepted once read)
_CONVERTED = {
    ("gemma3", "text"): {"layer_types", "rope_parameters", "rope_theta", "_sliding_window_pattern"},
    ("gemma4", "text"): {"per_layer_config"},
    ("gemma4", "vision"): {"rope_parameters"},
    ("gemma3", "top"): {"mm_tokens_per_image"},
}

_PARTS = {"text": "text_config", "vision": "vision_config", "audio": "audio_config"}
_CLASSES = {"top": "ModelConfig", "text": "TextConfig", "vision": "VisionConfig", "audio": "AudioConfig"}


def normalise_vlm(config: Mapping, family: str) -> dict:
    """``config`` (a deep copy) in the form mlx-vlm's ``family`` model reads; VLMConfigError
    naming the key when it holds something mlx-vlm would get wrong."""
    cfg = copy.deepcopy(dict(config))
    if family not in ("gemma3", "gemma4"):
        return cfg
    for part in ("text_config", "vision_config", "audio_config"):
        if part in cfg and cfg[part] is not None and not isinstance(cfg[part], dict):
            raise VLMConfigError(f"config.json: {part} is not an object")
    _token_names(cfg, family)
    original = _original(cfg)
    _fill(cfg, original, _fields(family, "top"))
    for part, key in _PARTS.items():
        sub = cfg.get(key)
        if isinstance(sub, dict):
            _fill(sub, (original or {}).get(key), _fields(family, part))
    if family == "gemma3":
        _gemma3(cfg)
    else:
        _gemma4(cfg)
    for part, key in (("top", None),) + tuple(_PARTS.items()):
        sub = cfg if key is None else cfg.get(key)
        if isinstance(sub, dict):
            _check_unread(sub, family, part, key)
    return cfg


# ---------------------------------------------------------------------- helpers

def _where(key: str | None, name: str) -> str:
    return f"{key}.{name}" if key else name


def _set(d: dict, key: str, value, source: str, where: str | None = None) -> None:
    """Set ``d[key]`` from ``source``; refuse when the config already says something else."""
    if d.get(key) is not None and not equal(d[key], value):
        raise VLMConfigError(f"config.json: {_where(where, key)} = {show(d[key])} and {source} = "
                             f"{show(value)} disagree")
    d[key] = value


def _fields(family: str, part: str) -> set[str]:
    try:
        mod = importlib.import_module(f"mlx_vlm.models.{family}.config")
    except ImportError:
        return set()
    cls = getattr(mod, _CLASSES[part], None)
    return {f.name for f in dataclasses.fields(cls)} if cls is not None else set()


def _original(cfg: dict) -> dict | None:
    """transformers' reading of the config as a dict, or None when it cannot read it."""
    o = original_config(cfg)
    return o.to_dict() if o is not None else None


#: never filled from transformers' reading (this module derives them, or they are mlx-vlm's own)
_NOT_FILLED = {"model_type", "rope_parameters", "rope_scaling", "layer_types", "per_layer_config",
               "sliding_window_pattern", "_sliding_window_pattern", "quantization", "quantization_config",
               "text_config", "vision_config", "audio_config"}


def _fill(sub: dict, original: Mapping | None, fields: set[str]) -> None:
    """Fields mlx-vlm reads that the config leaves out: transformers' value, not mlx-vlm's default."""
    if not isinstance(original, Mapping):
        return
    for f in fields:
        if f not in sub and f not in _NOT_FILLED and f in original:
            sub[f] = copy.deepcopy(original[f])
    # derived by transformers when absent (mlx-vlm derives them its own way), unless the
    # config gives them in mlx-vlm's form
    if ("layer_types" not in sub and "layer_types" in original
            and not {"sliding_window_pattern", "_sliding_window_pattern"} & set(sub)):
        sub["layer_types"] = copy.deepcopy(original["layer_types"])
    if ("rope_parameters" not in sub and isinstance(original.get("rope_parameters"), Mapping)
            and not {"rope_theta", "rope_global_base_freq", "rope_local_base_freq", "rope_scaling"} & set(sub)):
        sub["rope_parameters"] = copy.deepcopy(original["rope_parameters"])


def _token_names(cfg: dict, family: str) -> None:
    """``x_token_index`` and ``x_token_id`` are one key: both set, for whichever mlx-vlm reads."""
    for k in list(cfg):
        if k.endswith("_token_index") and cfg[k] is not None:
            _set(cfg, k[: -len("_index")] + "_id", cfg[k], k)
        elif k.endswith("_token_id") and cfg[k] is not None and k != "pad_token_id":
            _set(cfg, k[: -len("_id")] + "_index", cfg[k], k)


def _layer_types(tc: dict, where: str) -> list[str] | None:
    lt = tc.get("layer_types")
    if lt is None:
        return None
    n = tc.get("num_hidden_layers")
    if not isinstance(lt, list) or not all(t in ("sliding_attention", "full_attention") for t in lt):
        raise VLMConfigError(f"config.json: {where}.layer_types must list 'sliding_attention' / 'full_attention', "
                             f"got {show(lt)}")
    if isinstance(n, int) and len(lt) != n:
        raise VLMConfigError(f"config.json: {where}.layer_types has {len(lt)} entries for {n} layers")
    return lt


def _rope_of(rp: Mapping, kind: str, where: str) -> dict:
    r = rp.get(kind)
    if not isinstance(r, Mapping):
        raise VLMConfigError(f"config.json: {where}.rope_parameters has no {kind!r} entry")
    return dict(r)


# ---------------------------------------------------------------------- Gemma 3

def _gemma3(cfg: dict) -> None:
    tc = cfg.setdefault("text_config", {})
    w = "text_config"
    if "mm_tokens_per_image" in cfg:
        _set(tc, "mm_tokens_per_image", cfg["mm_tokens_per_image"], "mm_tokens_per_image", w)
    if isinstance(tc.get("hidden_size"), int):
        cfg["hidden_size"] = tc["hidden_size"]  # (mlx-vlm's top-level hidden_size scales image features)
    lt = _layer_types(tc, w)
    if lt is None and isinstance(tc.get("_sliding_window_pattern"), int) and "sliding_window_pattern" not in tc:
        tc["sliding_window_pattern"] = tc["_sliding_window_pattern"]
    if lt is not None:
        k = lt.index("full_attention") + 1 if "full_attention" in lt else len(lt) + 1
        if any((t == "full_attention") != ((i + 1) % k == 0) for i, t in enumerate(lt)):
            raise VLMConfigError(f"config.json: {w}.layer_types is not a full-attention layer every k layers "
                                 f"(mlx-vlm's Gemma 3 has only sliding_window_pattern): {show(lt)}")
        _set(tc, "sliding_window_pattern", k, f"{w}.layer_types", w)
    rp = tc.get("rope_parameters")
    if isinstance(rp, Mapping):
        if any(isinstance(v, Mapping) for v in rp.values()):
            full, slid = _rope_of(rp, "full_attention", w), _rope_of(rp, "sliding_attention", w)
        else:
            full = slid = dict(rp)
        for name, r in (("full_attention", full), ("sliding_attention", slid)):
            f = r.get("partial_rotary_factor", 1.0)
            if f not in (None, 1, 1.0):
                raise VLMConfigError(f"config.json: {w}.rope_parameters.{name}.partial_rotary_factor = {show(f)}: "
                                     "mlx-vlm's Gemma 3 rotates whole heads")
        st = slid.get("rope_type", slid.get("type", "default"))
        if st not in (None, "default"):
            raise VLMConfigError(f"config.json: {w}.rope_parameters.sliding_attention.rope_type = {show(st)}: "
                                 "mlx-vlm's Gemma 3 scales RoPE on the full-attention layers only")
        if "rope_theta" in full:
            _set(tc, "rope_global_base_freq", full["rope_theta"], f"{w}.rope_parameters.full_attention.rope_theta", w)
        if "rope_theta" in slid:
            _set(tc, "rope_local_base_freq", slid["rope_theta"],
                 f"{w}.rope_parameters.sliding_attention.rope_theta", w)
        ft = full.get("rope_type", full.get("type", "default"))
        if ft not in (None, "default"):
            s = {k: v for k, v in full.items() if k not in ("rope_theta", "partial_rotary_factor")}
            s.update(rope_type=ft, type=ft)
            tc["rope_scaling"] = s
        elif tc.get("rope_scaling") is not None:
            raise VLMConfigError(f"config.json: {w}.rope_scaling = {show(tc['rope_scaling'])} beside "
                                 "rope_parameters with no scaling")
    elif "rope_theta" in tc:
        _set(tc, "rope_global_base_freq", tc["rope_theta"], f"{w}.rope_theta", w)


# ---------------------------------------------------------------------- Gemma 4

def _gemma4(cfg: dict) -> None:
    tc = cfg.setdefault("text_config", {})
    w = "text_config"
    lt = _layer_types(tc, w)
    plc = tc.get("per_layer_config")
    if plc is not None:
        if not isinstance(plc, Mapping):
            raise VLMConfigError(f"config.json: {w}.per_layer_config is not an object")
        if lt is None:
            raise VLMConfigError(f"config.json: {w}.per_layer_config without layer_types")
        over: dict[int, dict] = {}
        for k, v in plc.items():
            try:
                i = int(k)
            except (TypeError, ValueError):
                raise VLMConfigError(f"config.json: {w}.per_layer_config key {k!r} is not a layer index") from None
            if not 0 <= i < len(lt) or not isinstance(v, Mapping):
                raise VLMConfigError(f"config.json: {w}.per_layer_config[{k!r}] names no layer's overrides")
            bad = set(v) - {"head_dim", "num_key_value_heads"}
            if bad:
                raise VLMConfigError(f"config.json: {w}.per_layer_config[{k!r}].{sorted(bad)[0]}: mlx-vlm's Gemma 4 "
                                     "has no per-layer field for it")
            over[i] = dict(v)
        full = [i for i, t in enumerate(lt) if t == "full_attention"]
        if any(lt[i] != "full_attention" for i in over):
            i = next(i for i in over if lt[i] != "full_attention")
            raise VLMConfigError(f"config.json: {w}.per_layer_config overrides sliding layer {i}: mlx-vlm's Gemma 4 "
                                 "has one head size for every sliding layer")
        forms = {tuple(sorted(over.get(i, {}).items())) for i in full}
        if len(forms) > 1:
            raise VLMConfigError(f"config.json: {w}.per_layer_config differs between full-attention layers: "
                                 "mlx-vlm's Gemma 4 has one global head size")
        o = dict(forms.pop()) if forms else {}
        _set(tc, "global_head_dim", o.get("head_dim", tc.get("head_dim")), f"{w}.per_layer_config head_dim", w)
        if "num_key_value_heads" in o:
            if not tc.get("attention_k_eq_v"):
                if o["num_key_value_heads"] != tc.get("num_key_value_heads"):
                    raise VLMConfigError(f"config.json: {w}.per_layer_config num_key_value_heads = "
                                         f"{o['num_key_value_heads']} on the full layers without attention_k_eq_v: "
                                         "mlx-vlm's Gemma 4 has no field for it")
            else:
                _set(tc, "num_global_key_value_heads", o["num_key_value_heads"],
                     f"{w}.per_layer_config num_key_value_heads", w)
        elif tc.get("attention_k_eq_v"):
            tc["num_global_key_value_heads"] = None  # (transformers: the full layers keep num_key_value_heads)
    bd = tc.get("use_bidirectional_attention")
    if bd not in (None, "vision"):
        raise VLMConfigError(f"config.json: {w}.use_bidirectional_attention = {show(bd)}: mlx-vlm's Gemma 4 "
                             "implements only None and 'vision'")
    rp = tc.get("rope_parameters")
    if isinstance(rp, Mapping):
        for name in ("sliding_attention", "full_attention"):
            r = _rope_of(rp, name, w)
            t = r.get("rope_type", r.get("type", "default"))
            f = r.get("partial_rotary_factor", 1.0)
            if t in (None, "default", "linear") and f not in (None, 1, 1.0):
                raise VLMConfigError(f"config.json: {w}.rope_parameters.{name}.partial_rotary_factor = {show(f)} "
                                     f"with rope_type {t!r}: mlx-vlm rotates whole heads there")
    if tc.get("hidden_size_per_layer_input") and tc.get("pad_token_id", 0) not in (0, None):
        raise VLMConfigError(f"config.json: {w}.pad_token_id = {show(tc['pad_token_id'])}: mlx-vlm's Gemma 4 "
                             "embeds per-layer inputs of media tokens as token 0")
    vc = cfg.get("vision_config")
    if isinstance(vc, dict):
        r = vc.get("rope_parameters")
        if r is not None:
            t = r.get("rope_type", r.get("type", "default")) if isinstance(r, Mapping) else r
            if not isinstance(r, Mapping) or t not in ("default", "axial") or "rope_theta" not in r:
                raise VLMConfigError(f"config.json: vision_config.rope_parameters = {show(r)}: mlx-vlm's Gemma 4 "
                                     "vision tower has axial RoPE with a rope_theta only")


# ---------------------------------------------------------------------- unread keys

def _check_unread(sub: dict, family: str, part: str, key: str | None) -> None:
    fields = _fields(family, part)
    if not fields:
        return
    neutral = NEUTRAL.get((family, part), {})
    converted = _CONVERTED.get((family, part), set())
    for k, v in sub.items():
        if k in neutral:  # (mlx-vlm's dataclass may have the field, its code implements one value)
            if not any(equal(v, n) for n in neutral[k]):
                raise VLMConfigError(f"config.json: {_where(key, k)} = {show(v)}: mlx-vlm's {family} implements only "
                                     + " / ".join(show(n) for n in neutral[k]))
            continue
        if k in fields or k in IGNORED or k in converted or k in _PARTS.values():
            continue
        if k.endswith(("_token_id", "_token_index")):
            continue
        if v is None or v is False:
            continue  # (an unset option)
        raise VLMConfigError(f"config.json: {_where(key, k)} = {show(v)}: mlx-vlm's {family} does not read it")


# ---------------------------------------------------------------------- tensor names

def rename_weights(weights: dict, family: str) -> dict:
    """Tensor names as transformers 5 writes them -> the names mlx-vlm's model has: Gemma 3's
    SigLIP tower under ``vision_tower.`` (transformers 5 flattens SigLIP) goes under
    ``vision_tower.vision_model.``; ``model.language_model.`` / ``model.vision_tower.`` /
    ``model.multi_modal_projector.`` lose ``model.`` (``language_model.model.`` for the text); SigLIP's
    pooling head (``vision_use_head``), which Gemma 3 never runs, is dropped."""
    if family != "gemma3":
        return weights
    out = {}
    for k, v in weights.items():
        n = k
        if n.startswith("model.language_model."):
            n = "language_model.model." + n[len("model.language_model."):]
        elif n.startswith(("model.vision_tower.", "model.multi_modal_projector.")):
            n = n[len("model."):]
        elif n == "lm_head.weight":
            n = "language_model.lm_head.weight"
        if n.startswith("vision_tower.") and not n.startswith("vision_tower.vision_model."):
            n = "vision_tower.vision_model." + n[len("vision_tower."):]
        if n.startswith("vision_tower.vision_model.head."):
            continue  # (SigLIP's pooling head: Gemma 3 reads the tower's last hidden state, never the head)
        if n in out:
            raise VLMConfigError(f"model.safetensors: {k} and another tensor are both {n}")
        out[n] = v
    return out
