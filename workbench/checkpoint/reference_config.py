"""config.json read once, in every form the references write, into what mlx-lm's model reads.

mlx-lm builds a model from config.json through its family's ``ModelArgs`` dataclass: a field
the config lacks silently takes mlx-lm's default, and a key no field reads is silently
dropped.  Checkpoints saved by transformers 5 keep their RoPE only under
``rope_parameters`` (``rope_theta``, ``partial_rotary_factor``, the scaling type), and
rename keys, so mlx-lm would build them with its own defaults: logits that look fine and
are wrong.  :func:`normalise` makes the config explicit before mlx-lm sees it:

1. **RoPE**: ``rope_parameters`` (flat, or per layer type) becomes the fields the family
   reads (``rope_theta`` / ``rotary_emb_base``, ``partial_rotary_factor`` / ``rotary_pct``,
   ``rope_scaling`` with both ``type`` and ``rope_type``, Gemma 3's ``rope_local_base_freq``);
   a value both forms give differently, or a RoPE the family has no field for, is refused;
   the older form's missing base or rotated fraction is the original's (transformers keeps
   those defaults in its config class's ``rope_parameters``).
2. **The original's values**: where the model's own config class (transformers', which
   mlx-lm depends on; no torch) reads the config, every ``ModelArgs`` field the config lacks
   takes the value the original model uses (transformers' default or derived value), not
   mlx-lm's default.  Renamed keys the original reads under another name are in
   :data:`ALIASES`.
3. **Keys nobody reads**: a key the family's ``ModelArgs`` does not read is accepted only
   when it cannot change the numbers: provenance and training settings
   (:data:`IGNORED`), leftovers the original keeps and never reads (:data:`KEPT_UNREAD`), a
   value equal to what the original derives without it, or a key the original reads only to
   derive others where it derives the same (:data:`DERIVATION_ONLY`).  Anything else is refused
   by name (``ConfigError``: one line).  A required field the config leaves null or out is
   derived as the original's code derives it (:data:`DERIVED`); where mlx-lm's family computes
   a config otherwise than the original and no key can say so, :data:`DEPARTURES` refuses it
   naming how; a field mlx-lm reads under the original's key with another meaning is given the
   value that means the original's (:data:`REMEANT`: Jamba's expert layers), and one the original
   has no option for is filled at what the original computes, another value refused
   (:data:`FIXED`).  A sliding window mlx-lm's family
   never applies is applied at module level where :data:`WINDOWS_APPLIED` has the original's
   rule (checkpoint/corrections/windows.py); any other becomes :attr:`Normalised.max_tokens`:
   prompts up to it are exact, longer ones are refused at trace time (but a window no module
   reads, :data:`WINDOW_UNREAD`).  Keys a correction reads
   as the original does are in :data:`READ_BY_CORRECTIONS`; transformers' tagged floats
   (``{"__float__": "Infinity"}``) are read as the floats they are.

Everything here is pure config work: nothing is built, nothing allocated.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

from workbench import registry
from workbench.errors import ConfigError  # (config.json holds something the reference would get wrong)

#: keys published configs carry that the original config class keeps as plain attributes and no
#: model reads -> why they cannot change the logits (checked: no module of transformers 5.25 or
#: mlx-lm 0.32 names them); accepted at both granularities, at any value
KEPT_UNREAD: dict[str, str] = {
    "is_llama_config": "a nanotron (training framework) export flag SmolLM2 publishes; no model reads it",
    "rope_interleaved": "nanotron's RoPE layout flag, left in SmolLM2's config.json; transformers' Llama "
                        "always rotates halves and reads no such key (any value: the original's numbers)",
    "transformers.js_config": "transformers.js's (ONNX runtime) export hints SmolLM2 publishes; no Python model "
                              "reads them",
    "use_mrope": "Qwen2.5's config.json carries Qwen2-VL's multimodal-RoPE flag; Qwen2Config keeps it as a plain "
                 "attribute and no text model of transformers or mlx-lm reads it",
    "cache_implementation": "which KV-cache class generate() builds (Gemma 2/3 publish \"hybrid\"): read by "
                            "transformers' GenerationConfig, never by a model's forward",
}

#: keys any Hugging Face / MLX config may carry that do not change a text model's logits:
#: provenance, storage dtype, token ids, generation and training settings, and what is
#: read elsewhere (model_type picks the family, the quantization block is quant.py's)
COMMON_IGNORED = frozenset({
    "model_type", "quantization", "quantization_config",
    "architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "initializer_range", "attention_dropout", "output_hidden_states", "output_attentions", "return_dict",
    "embd_pdrop", "resid_pdrop",  # (dropout: training only; Llama-family exports such as Nanbeige carry them)
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "id2label", "label2id", "problem_type",
    "tokenizer_class", "prefix", "finetuning_task", "task_specific_params", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "pruned_heads", "tie_encoder_decoder", "add_cross_attention",
    "cross_attention_hidden_size", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
}) | frozenset(KEPT_UNREAD)


#: keys that never change a causal LM's logits at inference: provenance, training-only
#: settings (dropout, init, aux losses, router noise), generation settings, token ids
IGNORED = COMMON_IGNORED | frozenset({
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "hidden_dropout", "residual_dropout", "embedding_dropout",
    "classifier_dropout", "summary_first_dropout", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "output_router_logits", "router_aux_loss_coef", "router_z_loss_coef",
    "router_jitter_noise", "input_jitter_noise", "rescale_prenorm_residual", "time_step_min", "time_step_max",
    "time_step_floor", "time_step_init_scheme", "time_step_scale", "use_mambapy", "use_associative_scan",
    "pretraining_tp", "eod_token_id", "image_token_id", "auto_map", "model_file", "num_nextn_predict_layers",
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "reorder_and_upcast_attn",
    "use_kernels", "mlp_layer_types", "_sliding_window_pattern",
    "tie_word_embeddings", "max_position_embeddings", "initializer_factor", "use_return_dict",
    "gradient_checkpointing", "residual_in_fp32", "use_pre_ffw_norm",
})
# (tie_word_embeddings: a family that always ties has no lm_head, and mlx-lm's strict load
#  refuses a checkpoint that holds one; max_position_embeddings alone never changes the
#  logits of a prompt within it, RoPE scaling reads it from rope_scaling)

#: family -> {mlx-lm field: the key transformers writes for it}
ALIASES: dict[str, dict[str, str]] = {
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "gpt2": {"n_ctx": "n_positions"},
    "gpt_neox": {"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"},
    "lfm2": {"block_dim": "hidden_size", "block_ff_dim": "intermediate_size"},
}

#: family -> (the mlx-lm field for rope theta, the one for the rotated fraction)
_ROPE_FIELDS = {"gpt_neox": ("rotary_emb_base", "rotary_pct")}

#: unread keys whose non-default values are a sliding window the family never applies
_WINDOW_KEYS = ("sliding_window",)

#: original model_type -> which of its layers slide, for the originals whose sliding window mlx-lm's
#: family never applies (or, for Mistral through mlx-lm's llama, applies only where layer_types
#: says) and workbench applies at module level as transformers does (checkpoint/corrections/
#: windows.py): its prompts are not bounded by the window
WINDOWS_APPLIED: dict[str, str] = {
    "gemma2": "layer_types", "mistral": "every layer", "mixtral": "every layer", "phi3": "every layer",
    "phimoe": "every layer", "starcoder2": "every layer",
    # (Qwen: the window only with use_sliding_window true, on the layers the config class derives from
    #  max_window_layers -- Qwen2 / Qwen3 from that layer on, Qwen2-MoE the even layers below it --
    #  unless layer_types is given)
    "qwen2": "layer_types", "qwen2_moe": "layer_types", "qwen3": "layer_types",
}

#: original model_type -> why its config's sliding_window bounds nothing: its config class declares
#: the key, and no module of the original nor of mlx-lm's family reads it (accepted at any value)
WINDOW_UNREAD: dict[str, str] = {
    "nemotron_h": "NemotronHConfig declares sliding_window, but transformers' NemotronH masks its attention "
                  "layers with create_causal_mask (full) and builds its cache from layer_types (full_attention), "
                  "and mlx-lm's nemotron_h reads no window: no prompt length changes the numbers",
}

#: family -> {key its mlx-lm module does not read: the correction that reads it as the original
#: does (checkpoint/corrections/)}
READ_BY_CORRECTIONS: dict[str, dict[str, str]] = {
    "qwen2_moe": {"norm_topk_prob": "routing.py: the top-k weights divided by their sum, as transformers' "
                                    "Qwen2MoeTopKRouter does",
                  "use_sliding_window": "windows.py", "max_window_layers": "windows.py"},
    # (windows.py: the layers the original slides, from its layer_types derived as transformers derives it)
    **{f: {"use_sliding_window": "windows.py", "max_window_layers": "windows.py"} for f in ("qwen2", "qwen3")},
    "ernie4_5_moe": {"moe_norm_min": "routing.py: the floor of the top-k weights' sum, as transformers' "
                                     "Ernie4_5_MoeTopKRouter clamps it"},
    # (activation.py: the MLP runs the activation the original reads, where mlx-lm hard-codes one)
    "starcoder2": {"hidden_act": "activation.py"}, "gpt_bigcode": {"activation_function": "activation.py"},
    "gpt_neox": {"hidden_act": "activation.py"},
    "gemma": {"hidden_act": "activation.py", "hidden_activation": "activation.py"},
}

#: keys the original reads only to derive other config values -> where (checked in transformers
#: 5.25's config classes and modeling files): such a key, off its default, is accepted when the
#: original derives the same config with it as without it (its effect switched off by another key)
DERIVATION_ONLY: dict[str, str] = {
    "max_window_layers": "read only by the config classes of Qwen2/2-MoE/3/3-MoE and kin, to derive "
                         "layer_types, and only when use_sliding_window is true (Qwen1.5-MoE publishes 21 "
                         "with use_sliding_window false: every layer full attention either way)",
    "global_attn_every_n_layers": "read only by AfmoeConfig, to derive layer_types when the config has none "
                                  "(transformers writes layer_types beside it; mlx-lm's afmoe reads layer_types)",
}


@dataclass
class Normalised:
    """The config the reference reads, and what normalising it found."""
    config: dict
    filled: dict = field(default_factory=dict)      # field -> value taken from the original / rope_parameters
    consumed: set = field(default_factory=set)      # keys read into fields of another name
    max_tokens: int | None = None                   # prompts longer than this would be computed wrongly
    why_max: str = ""


def show(v) -> str:
    """A config value as a message shows it (JSON, cut at 60 characters)."""
    r = json.dumps(v) if isinstance(v, (dict, list, str, int, float, bool, type(None))) else repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _fields(library: str, family: str, args: str = "ModelArgs") -> dict[str, dataclasses.Field] | None:
    mod = registry.import_reference(library, family)
    args = getattr(mod, args, None)
    return {f.name: f for f in dataclasses.fields(args)} if dataclasses.is_dataclass(args) else None


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


# ---------------------------------------------------------------------- transformers' view

def _original_class(model_type: str):
    """transformers' config class for ``model_type`` (None if it has none)."""
    try:
        from transformers import CONFIG_MAPPING
        return CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001 - no transformers, or no such model type
        return None


def _read_with(cls, cfg: Mapping):
    """``cls.from_dict(cfg)``, quietly; None when transformers refuses the config."""
    tlog = logging.getLogger("transformers")
    level = tlog.level
    tlog.setLevel(logging.CRITICAL)  # (its "Can't set ..." errors: a config it refuses, None here)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls.from_dict(copy.deepcopy(dict(cfg)))
    except Exception:  # noqa: BLE001 - the original cannot read it: our own rules only
        return None
    finally:
        tlog.setLevel(level)


_DECLARED: dict = {}


def _declared(cls) -> frozenset:
    """The keys the original's config class declares (its default instance's)."""
    if cls not in _DECLARED:
        d = _read_with(cls, {})
        _DECLARED[cls] = frozenset(d.to_dict()) if d is not None else frozenset()
    return _DECLARED[cls]


def original_config(cfg: Mapping):
    """transformers' own reading of ``cfg`` (its config class for ``model_type``: defaults and
    derived values filled in), or None when it has no such class or refuses the config."""
    mt = cfg.get("model_type")
    cls = _original_class(mt) if isinstance(mt, str) else None
    return _read_with(cls, cfg) if cls is not None else None


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def equal(a, b) -> bool:
    """Config values equal as JSON reads them (booleans are not numbers; floats to 1e-12)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------------- RoPE

_ROPE_META = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def _flat_rope(rp: Mapping) -> bool:
    """One RoPE for every layer (not one per layer type: a model whose original reads RoPE per
    layer type reads the per-type entries, even beside flat keys)."""
    return not any(isinstance(v, Mapping) for v in rp.values())


def _set(cfg: dict, out: Normalised, key: str, value, source: str) -> None:
    """Set ``key`` from ``source``; refuse if the config already says something else."""
    if key in cfg and cfg[key] is not None:
        if not equal(cfg[key], value):
            raise ConfigError(f"config.json: {key} = {show(cfg[key])} and {source} = {show(value)} disagree")
        return
    cfg[key] = value
    out.filled[key] = value


def _scaling(rp: Mapping) -> dict | None:
    t = rp.get("rope_type", rp.get("type", "default"))
    if t in (None, "default"):
        return None
    s = {k: v for k, v in rp.items() if k not in _ROPE_META}
    return {"type": t, "rope_type": t, **s}


def _apply_flat_rope(cfg: dict, out: Normalised, fields: Mapping, family: str, rp: Mapping, where: str) -> None:
    theta_f, frac_f = _ROPE_FIELDS.get(family, ("rope_theta", "partial_rotary_factor"))
    if "rope_theta" in rp:
        if theta_f in fields:
            _set(cfg, out, theta_f, rp["rope_theta"], f"{where}.rope_theta")
        elif "rope_parameters" not in fields:
            raise ConfigError(f"config.json: {where}.rope_theta = {show(rp['rope_theta'])}, but mlx-lm's "
                              f"{family} reads no RoPE base")
    if "partial_rotary_factor" in rp:
        frac = rp["partial_rotary_factor"]
        if frac_f in fields:
            _set(cfg, out, frac_f, frac, f"{where}.partial_rotary_factor")
        elif "rope_parameters" not in fields and not equal(frac, 1.0):
            raise ConfigError(f"config.json: {where}.partial_rotary_factor = {show(frac)}, but mlx-lm's "
                              f"{family} rotates every dimension")
    if "original_max_position_embeddings" in rp and "original_max_position_embeddings" in fields:
        _set(cfg, out, "original_max_position_embeddings", rp["original_max_position_embeddings"],
             f"{where}.original_max_position_embeddings")
    s = _scaling(rp)
    if s is not None:
        if "rope_scaling" in fields:
            if cfg.get("rope_scaling") is None:
                cfg["rope_scaling"] = s
                out.filled["rope_scaling"] = s
        elif "rope_parameters" not in fields:
            raise ConfigError(f"config.json: {where}.rope_type = {show(s['type'])}, but mlx-lm's {family} "
                              "reads no RoPE scaling")


def _apply_rope(cfg: dict, out: Normalised, fields: Mapping, family: str, original=None) -> None:
    rp = cfg.get("rope_parameters")
    if rp is None:
        # the older form: its keys are read as they are; a RoPE base or rotated fraction it does
        # not give is the original's default, which transformers keeps in rope_parameters (Phi-3
        # 4k publishes no partial_rotary_factor: 1.0).  Only those two: transformers' defaults
        # for scaling are its own
        orp = getattr(original, "rope_parameters", None) if original is not None else None
        if not (isinstance(orp, Mapping) and _flat_rope(orp)):
            return
        for key, f in zip(("rope_theta", "partial_rotary_factor"),
                          _ROPE_FIELDS.get(family, ("rope_theta", "partial_rotary_factor"))):
            if key in orp and f in fields and f not in cfg and key not in cfg:
                _set(cfg, out, f, orp[key], f"the original's default {key}")
        return
    if not isinstance(rp, Mapping):
        raise ConfigError(f"config.json: rope_parameters must be an object, got {show(rp)}")
    if _flat_rope(rp):
        _apply_flat_rope(cfg, out, fields, family, rp, "rope_parameters")
        return
    # per layer type (Gemma 3 and others): {"full_attention": {...}, "sliding_attention": {...}}
    rp = {k: v for k, v in rp.items() if isinstance(v, Mapping)}
    if "rope_local_base_freq" in fields and set(rp) <= {"full_attention", "sliding_attention"}:
        full, slide = rp.get("full_attention", {}), rp.get("sliding_attention", {})
        if _scaling(slide) is not None:
            raise ConfigError("config.json: rope_parameters.sliding_attention scales its RoPE "
                              f"({show(slide.get('rope_type'))}), which mlx-lm's {family} does not")
        if "rope_theta" in slide:
            _set(cfg, out, "rope_local_base_freq", slide["rope_theta"], "rope_parameters.sliding_attention.rope_theta")
        _apply_flat_rope(cfg, out, fields, family, full, "rope_parameters.full_attention")
        return
    kinds = list(rp.values())
    if all(equal(k, kinds[0]) for k in kinds):
        _apply_flat_rope(cfg, out, fields, family, kinds[0], f"rope_parameters.{next(iter(rp))}")
        return
    if "rope_parameters" not in fields:
        raise ConfigError(f"config.json: rope_parameters differ per layer type ({', '.join(map(str, rp))}), "
                          f"which mlx-lm's {family} does not read")


# ---------------------------------------------------------------------- layer types

#: fields that give the layer pattern as a period (every p-th layer is the second kind)
_PERIODS = {"sliding_window_pattern": ("sliding_attention", "full_attention"),
            "full_attention_interval": ("linear_attention", "full_attention")}


#: families that read the period as a string of layer kinds ("LLLG": three local, one global)
_PERIOD_AS_STRING = ("exaone4",)


def _apply_layer_types(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """``layer_types`` (transformers 5, which derives it from a period only when absent and
    reads it first) for a family that reads a period instead: the period, or refused."""
    lt = cfg.get("layer_types")
    if lt is None or "layer_types" in fields:
        return
    for period, (kind, every) in _PERIODS.items():
        if period not in fields:
            continue
        if not isinstance(lt, list) or not lt or any(t not in (kind, every) for t in lt):
            raise ConfigError(f"config.json: layer_types = {show(lt)}: mlx-lm's {family} reads {kind} and "
                              f"{every} layers only")
        p = lt.index(every) + 1 if every in lt else len(lt) + 1
        if any((t == every) != ((i + 1) % p == 0) for i, t in enumerate(lt)):
            raise ConfigError(f"config.json: layer_types = {show(lt)} is not every {p}-th layer {every}, the "
                              f"only pattern mlx-lm's {family} reads ({period})")
        value = "L" * (p - 1) + ("G" if p <= len(lt) else "") if family in _PERIOD_AS_STRING else p
        if cfg.get(period) != value:
            cfg[period] = value
            out.filled[period] = value
        out.consumed.add("layer_types")
        return


# ---------------------------------------------------------------------- the whole config

#: how transformers writes a float JSON has no literal for (PreTrainedConfig._encode_special_floats:
#: Nemotron-H's time_step_limit [0.0, inf] is written [0.0, {"__float__": "Infinity"}])
_SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def special_floats(v):
    """``v`` with transformers' tagged floats ({"__float__": "Infinity"}) read as the floats they
    are, as transformers reads config.json."""
    if isinstance(v, dict):
        if set(v) == {"__float__"} and v["__float__"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[v["__float__"]]
        return {k: special_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [special_floats(x) for x in v]
    return v


def normalise(config: Mapping, library: str, family: str, *, args: str = "ModelArgs") -> Normalised:
    """The config (a deep copy) in the form ``library``'s ``family`` reads (through its
    dataclass ``args``); ConfigError naming the key when something it would get wrong cannot
    be made explicit."""
    cfg = special_floats(copy.deepcopy(dict(config)))
    out = Normalised(cfg)
    if library != "mlx_lm":
        return out
    if args == "ModelArgs" and registry.WRAPPED_TEXT.get(cfg.get("model_type")) == family:
        # a text-only checkpoint of a family mlx-lm builds through its wrapper: the config,
        # read as the wrapper's TextConfig, is its text_config (its keys stay at the top too)
        inner = normalise(config, library, family, args="TextConfig")
        inner.config = dict(inner.config, model_type=family, text_config=copy.deepcopy(inner.config))
        return inner
    fields = _fields(library, family, args)
    if fields is None:
        return out
    if "text_config" in fields:  # a wrapper: its language model reads text_config
        tc = cfg.get("text_config")
        tmt = tc.get("model_type") if isinstance(tc, Mapping) else None
        if isinstance(tmt, str) and registry.lm_module(tmt) is not None:
            fam = registry.lm_module(tmt)
            inner = normalise(tc, library, fam, args="TextConfig" if registry.WRAPPED_TEXT.get(tmt) == fam
                              else "ModelArgs")
            cfg["text_config"] = inner.config
            out.filled.update({f"text_config.{k}": v for k, v in inner.filled.items()})
            out.max_tokens, out.why_max = inner.max_tokens, inner.why_max
            # (mlx-lm's wrappers copy their own vocab_size into text_config: transformers
            #  writes it in text_config only)
            if "vocab_size" in fields and "vocab_size" not in cfg and "vocab_size" in inner.config:
                cfg["vocab_size"] = inner.config["vocab_size"]
                out.filled["vocab_size"] = cfg["vocab_size"]
        return out  # (the wrapper's other keys configure towers mlx-lm does not build)
    mt = cfg.get("model_type")
    cls = _original_class(mt) if isinstance(mt, str) else None
    original = _read_with(cls, cfg) if cls is not None else None
    _apply_per_layer_config(cfg, out, fields, family)
    _apply_rope(cfg, out, fields, family, original)
    _apply_layer_types(cfg, out, fields, family)
    _window_everywhere(cfg, out, fields, family)
    for target, source in ALIASES.get(family, {}).items():
        if source in cfg and target in fields:
            _set(cfg, out, target, cfg[source], source)
    if original is not None:
        _fill_derived(cfg, out, fields, family, original)
        _fill_from_original(cfg, out, fields, original)
    _fill_fixed(cfg, out, fields, family, cls)
    _alpha_rope(cfg, out)
    _remeant(cfg, out, fields, family)
    if original is not None:
        _check_unread(cfg, out, fields, family, cls, original)
        _check_defaulted(cfg, fields, family)
    _check_departures(cfg, family)
    return out


#: fields mlx-lm reads that no transformers config of the family writes, whose mlx-lm
#: default is what the original's modeling code does (checked against transformers'
#: modeling files; where a fixture exists, against torch's logits: tests/test_arch_refs.py)
REVIEWED_DEFAULTS: dict[str, frozenset] = {
    # rope_traditional: mlx-lm's switch between rotate-half and interleaved RoPE;
    # original_max_position_embeddings: read by long-context RoPE scaling only, which carries
    # it (rope_parameters, filled above)
    "*": frozenset({"rope_traditional", "original_max_position_embeddings"}),
    "llama": frozenset({"layer_types", "sliding_window", "mlp_bias", "attention_bias"}),
    # dots1's scoring_func: a field mlx-lm declares and never reads (its router is sigmoid plus
    # e_score_correction_bias, as transformers' Dots1TopkRouter always is)
    "dots1": frozenset({"mlp_bias", "scoring_func"}),
    # ernie4_5_moe: moe_capacity and moe_use_aux_free are declared, never read by mlx-lm (transformers'
    # config has neither: its router always adds e_score_correction_bias, zero where aux-free balancing
    # was off); moe_gate_act is no option of the original (its Ernie4_5_MoeTopKRouter is a softmax),
    # and the corrected router (checkpoint/corrections/routing.py) never reads it: at any value, the
    # original's numbers
    "ernie4_5_moe": frozenset({"moe_capacity", "moe_use_aux_free", "moe_gate_act"}),
    # afmoe (transformers' AfmoeTokenChoiceRouter): sigmoid scores (score_func), no expert groups
    # (n_group = topk_group = 1: mlx-lm groups only above 1), the top-k scores always divided by
    # their sum (route_norm true); the corrected router (checkpoint/corrections/routing.py) reads
    # none of the four: at any value, the original's numbers
    "afmoe": frozenset({"route_norm", "score_func", "n_group", "topk_group"}),
    "bitnet": frozenset({"mlp_bias"}), "olmo2": frozenset({"mlp_bias"}),
    "olmoe": frozenset({"mlp_bias"}), "granitemoehybrid": frozenset({"mlp_bias"}),
    "cohere": frozenset({"layer_norm_bias"}), "cohere2": frozenset({"layer_norm_bias"}),
    "gpt2": frozenset({"num_key_value_heads"}), "gpt_neox": frozenset({"num_key_value_heads"}),
    "gpt_bigcode": frozenset({"attention_bias", "mlp_bias"}),
    "deepseek_v2": frozenset({"moe_layer_freq"}),
    "deepseek_v3": frozenset({"moe_layer_freq", "scoring_func", "topk_method"}),
    "deepseek_v32": frozenset({"moe_layer_freq", "scoring_func", "topk_method", "indexer_rope_interleave"}),
    "glm4_moe": frozenset({"scoring_func", "topk_method"}),
    "hunyuan_v1_dense": frozenset({"use_qk_norm"}),
    "lfm2_moe": frozenset({"full_attn_idxs"}),  # derived from layer_types by mlx-lm itself
    "mamba": frozenset({"use_bcdt_rms", "mixer_rms_eps"}),  # set from model_type (falcon_mamba) by mlx-lm
    # (ssm_state_size: None, which mlx-lm reads as state_size, as transformers' Mamba2Mixer does;
    #  max_position_embeddings: a field mlx-lm's mamba2 declares and never reads)
    "mamba2": frozenset({"ssm_state_size", "max_position_embeddings"}),
    "ministral3": frozenset({"layer_types"}),
    # (no num_key_value_heads in per_layer_config: the full layers have the sliding ones' count)
    # (sliding_window_pattern: read only without layer_types, which transformers always writes)
    # (vocab_size_per_layer_input sizes a tensor: a wrong default is a shape mismatch, never silent)
    "gemma4_text": frozenset({"global_partial_rotary_factor", "partial_rotary_factor", "num_global_key_value_heads",
                              "sliding_window_pattern", "vocab_size_per_layer_input"}),
}


#: family -> [(when, why)]: configs whose numbers mlx-lm's family computes otherwise than the
#: original (transformers' modeling code), with no key to make them agree: refused, naming why
DEPARTURES: dict[str, list[tuple]] = {
    # (none left: ernie4_5_moe's e_score_correction_bias and afmoe's one expert a token are corrected,
    #  checkpoint/corrections/routing.py)
}


def _check_departures(cfg: Mapping, family: str) -> None:
    for when, why in DEPARTURES.get(family, ()):
        if when(cfg):
            raise ConfigError(f"config.json: {why}")


def _check_defaulted(cfg: dict, fields: Mapping, family: str) -> None:
    """A field mlx-lm reads, absent from the config and from the original's, takes mlx-lm's
    default: refused unless that default was checked against the original."""
    ok = REVIEWED_DEFAULTS["*"] | REVIEWED_DEFAULTS.get(family, frozenset())
    for name, f in fields.items():
        if name in cfg or name in ok or name in _NOT_FILLED:
            continue
        if name == "layer_types" and any(p in cfg and p in fields for p in _PERIODS):
            continue  # given as a period
        d = _default(f) if _has_default(f) else None
        raise ConfigError(f"config.json has no {name!r}, which mlx-lm's {family} reads (its default: {show(d)}) "
                          "and the original model's config does not carry: workbench has not checked that "
                          "default against the original")


def _apply_per_layer_config(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """Gemma 4's ``per_layer_config`` (transformers 5: {layer: {"head_dim", "num_key_value_heads"}}
    for the full-attention layers) as the global_head_dim / num_global_key_value_heads mlx-lm reads."""
    plc = cfg.get("per_layer_config")
    if plc is None or "global_head_dim" not in fields:
        return
    if not isinstance(plc, Mapping) or any(not isinstance(v, Mapping) for v in plc.values()):
        raise ConfigError(f"config.json: per_layer_config = {show(plc)} is not one object per layer")
    lt = cfg.get("layer_types")
    full = {str(i) for i, t in enumerate(lt) if t == "full_attention"} if isinstance(lt, list) else None
    keys = {str(int(k)) if str(k).isdigit() else str(k) for k in plc}
    if full is not None and keys != full:
        raise ConfigError("config.json: per_layer_config sets other layers than the full-attention ones "
                          f"({', '.join(sorted(keys))}), which mlx-lm's {family} cannot express")
    for key, target in (("head_dim", "global_head_dim"), ("num_key_value_heads", "num_global_key_value_heads")):
        vals = {json.dumps(v.get(key)) for v in plc.values()}
        if len(vals) > 1:
            raise ConfigError(f"config.json: per_layer_config gives full-attention layers different {key}s, which "
                              f"mlx-lm's {family} cannot express")
        v = next(iter(plc.values())).get(key) if plc else None
        if v is not None:
            _set(cfg, out, target, v, f"per_layer_config.*.{key}")
    other = {k for v in plc.values() for k in v} - {"head_dim", "num_key_value_heads"}
    if other:
        raise ConfigError(f"config.json: per_layer_config sets {', '.join(sorted(other))}, which mlx-lm's {family} "
                          "does not read per layer")
    out.consumed.add("per_layer_config")


#: original model_type -> fields mlx-lm requires that the original has no key for, at what the
#: original architecture fixes them to (transformers' modeling code, not its config): filled when
#: the config lacks them; a config giving another value (one the original would not read) is
#: refused by name, unless it computes the same (:func:`_as_fixed`)
FIXED: dict[str, dict[str, Any]] = {
    "apertus": {"mlp_bias": False, "post_norm": False, "qk_norm": True},
    # (transformers' HunYuanMoEV1, built by mlx-lm's hunyuan: one shared MLP of intermediate_size
    #  always added, q/k norms after RoPE, its own k/v on every layer (no cross-layer attention:
    #  cla_share_factor is read only with use_cla), experts of intermediate_size)
    "hunyuan_v1_moe": {"num_shared_expert": 1, "use_mixed_mlp_moe": True, "use_qk_norm": True, "use_cla": False,
                       "cla_share_factor": 1, "moe_intermediate_size": None},
}


#: family -> {field mlx-lm reads under the original's key with another meaning: (the value that
#: gives mlx-lm's family the original's meaning, from the config as filled; why)}
REMEANT: dict[str, dict[str, tuple]] = {
    "jamba": {"expert_layer_offset": (
        lambda c: -c["expert_layer_offset"] % c["expert_layer_period"]
        if all(isinstance(c.get(k), int) and not isinstance(c.get(k), bool) for k in
               ("expert_layer_offset", "expert_layer_period")) and c["expert_layer_period"] > 0 else None,
        "transformers' Jamba puts experts on the layers i with i % expert_layer_period == expert_layer_offset, "
        "mlx-lm's jamba on those with (i + expert_layer_offset) % expert_layer_period == 0 (the same layers "
        "for periods 1 and 2 only)")},
}


def _remeant(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """Each :data:`REMEANT` field given the value that means to mlx-lm what the config means."""
    for name, (value, _why) in REMEANT.get(family, {}).items():
        v = value(cfg) if name in fields else None
        if v is not None and not equal(v, cfg.get(name)):
            cfg[name] = v
            out.filled[name] = v


def _as_fixed(cfg: Mapping, key: str, fixed) -> bool:
    """A config's own value of a FIXED field computes what the original's fixed one does: per
    layer, the same everywhere; HunYuan's expert size, the MLP's; a factor its switch turns off."""
    if key == "cla_share_factor":
        return cfg.get("use_cla") is False
    vals = cfg[key] if isinstance(cfg[key], list) and cfg[key] else [cfg[key]]
    want = cfg.get("intermediate_size") if key == "moe_intermediate_size" else fixed
    return all(equal(v, want) for v in vals)


def _alpha_rope(cfg: dict, out: Normalised) -> None:
    """mlx-lm's hunyuan always rotates with NTK-alpha scaling (``rope_scaling["alpha"]``: the base
    times alpha ** (d / (d - 2)), transformers' HunYuanMoEV1 "ntk_alpha"); its plain RoPE is alpha 1;
    a scaling of another kind (linear, dynamic NTK without alpha) it cannot compute: refused."""
    if cfg.get("model_type") != "hunyuan_v1_moe":
        return
    s = cfg.get("rope_scaling")
    if s is None:
        s = {"type": "dynamic", "factor": 1.0, "alpha": 1.0}
    elif isinstance(s, Mapping) and s.get("rope_type", s.get("type")) == "dynamic" and \
            isinstance(s.get("alpha"), (int, float)) and not isinstance(s.get("alpha"), bool) and s["alpha"] > 0:
        s = {"factor": 1.0, **s, "type": "dynamic"}
    else:
        raise ConfigError(f"config.json: RoPE scaling {show(s)}: mlx-lm's hunyuan rotates with NTK alpha scaling "
                          "only (rope type dynamic with an alpha)")
    if not equal(s, cfg.get("rope_scaling")):
        cfg["rope_scaling"] = s
        out.filled["rope_scaling"] = s

#: family -> {unread key: the value the family's code assumes, from the config}
IMPLIED: dict[str, dict[str, Any]] = {
    "gpt_neox": {"intermediate_size": lambda c: 4 * c["hidden_size"] if isinstance(c.get("hidden_size"), int) else None},
    "phimoe": {"attention_bias": lambda c: True, "lm_head_bias": lambda c: True},
    # (mlx-lm's mamba2 sizes its mixer num_heads * head_dim, which Mamba2Config checks equals
    #  expand * hidden_size: expand is that ratio)
    "mamba2": {"expand": lambda c: c["num_heads"] * c["head_dim"] // c["hidden_size"]
               if all(isinstance(c.get(k), int) and c.get(k) > 0 for k in ("num_heads", "head_dim", "hidden_size"))
               and c["num_heads"] * c["head_dim"] % c["hidden_size"] == 0 else None},
}


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


#: family -> {field mlx-lm requires: (the value the original's modeling code derives where the
#: config gives none or null, from the original's reading of the config; where it is)}
DERIVED: dict[str, dict[str, tuple]] = {
    "gpt_bigcode": {"n_inner": (
        lambda o: 4 * _int(getattr(o, "n_embd", None)) if _int(getattr(o, "n_embd", None)) else None,
        "transformers' GPTBigCodeMLP: inner_dim = n_inner if not None else 4 * hidden_size")},
    "mamba2": {"intermediate_size": (
        lambda o: int(o.expand * o.hidden_size) if _int(getattr(o, "expand", None)) and
        _int(getattr(o, "hidden_size", None)) else None,
        "transformers' Mamba2Mixer: intermediate_size = int(expand * hidden_size); Mamba2Config has no such "
        "key and checks hidden_size * expand == num_heads * head_dim")},
}


def _fill_derived(cfg: dict, out: Normalised, fields: Mapping, family: str, original) -> None:
    """A required field the config leaves out or null, derived as the original's code derives it."""
    for name, (derive, _where) in DERIVED.get(family, {}).items():
        if name in fields and cfg.get(name) is None:
            v = derive(original)
            if v is not None:
                cfg[name] = v
                out.filled[name] = v


def _fill_fixed(cfg: dict, out: Normalised, fields: Mapping, family: str, cls=None) -> None:
    """Required fields the original never writes: the architecture's fixed values, the head
    size transformers implies (hidden / heads), no RoPE scaling when rope_parameters says none."""
    mt = cfg.get("model_type")
    for k, v in FIXED.get(mt, {}).items():
        if k in fields and k not in cfg:
            cfg[k] = v
            out.filled[k] = v
        elif k in fields and cls is not None and k not in _declared(cls) and not _as_fixed(cfg, k, v):
            raise ConfigError(f"config.json: {k} = {show(cfg[k])}, but the original {mt} has no such option "
                              f"(it computes as {k} = {show(v)}), and mlx-lm's {family} would read it")
    if "head_dim" in fields and cfg.get("head_dim") is None:
        hd = _implied_head_dim(cfg)
        if hd is not None:
            cfg["head_dim"] = hd
            out.filled["head_dim"] = hd
    if "rope_scaling" in fields and "rope_scaling" not in cfg:  # (no scaling in any form: none)
        cfg["rope_scaling"] = None


#: fields never taken from the original's attributes: RoPE comes from rope_parameters alone
#: (transformers 5 keeps a rope_scaling attribute for compatibility, in its own form)
_NOT_FILLED = ("model_type", "rope_parameters", "rope_scaling", "quantization", "quantization_config")


def _fill_from_original(cfg: dict, out: Normalised, fields: Mapping, original) -> None:
    """Every field mlx-lm reads that the config lacks takes the original model's value."""
    for name, f in fields.items():
        if name in cfg or name in _NOT_FILLED:
            continue
        if name == "layer_types" and any(p in cfg and p in fields for p in _PERIODS):
            continue  # the config gives the pattern as a period the family reads
        try:
            v = getattr(original, name)
        except Exception:  # noqa: BLE001 - the original has no such attribute
            continue
        if callable(v) or not _jsonable(v):
            continue
        cfg[name] = copy.deepcopy(v)
        if not (_has_default(f) and equal(v, _default(f))):
            out.filled[name] = v  # (where it differs from what mlx-lm alone would have used)


def _check_unread(cfg: dict, out: Normalised, fields: Mapping, family: str, cls, original) -> None:
    """A key the family does not read must not change the numbers (see the module doc)."""
    consumed = set(ALIASES.get(family, {}).values()) | {"rope_parameters", "text_config"} | out.consumed
    for key in list(cfg):
        if key in fields or key in IGNORED or key in consumed or key.endswith("_token_id") or \
                key in out.filled:
            continue
        if key not in _declared(cls):
            continue  # neither the reference nor the original declares it: nobody reads it
        if key in READ_BY_CORRECTIONS.get(family, {}):
            continue
        if cfg.get("model_type") in WINDOWS_APPLIED and (key in _WINDOW_KEYS or (
                key == "layer_types" and WINDOWS_APPLIED[cfg["model_type"]] == "layer_types")):
            continue  # (applied at module level, on the layers it marks: checkpoint/corrections/windows.py)
        without = {k: v for k, v in cfg.items() if k != key}
        derived = _read_with(cls, without)
        if derived is None:  # (the original cannot read the config without it: its class default)
            derived = _read_with(cls, {"model_type": cfg.get("model_type")})
        default = getattr(derived, key, None) if derived is not None else None
        if key in _WINDOW_KEYS and cfg.get("model_type") in WINDOW_UNREAD:
            continue  # (a window nobody applies: WINDOW_UNREAD)
        if key in _WINDOW_KEYS:
            w = cfg[key]
            # (a window the original switches off, as Qwen's use_sliding_window false does, bounds nothing)
            on = getattr(original, key, w) not in (None, 0)
            if isinstance(w, int) and not isinstance(w, bool) and w > 0 and on:
                out.max_tokens = w if out.max_tokens is None else min(out.max_tokens, w)
                out.why_max = (f"config.json: sliding_window = {w}, which mlx-lm's {family} never applies: "
                               f"its numbers are exact for prompts up to {w} tokens")
            continue
        if derived is not None and equal(cfg[key], default):
            continue
        if derived is not None and equal(getattr(original, key, None), default):
            continue  # the original reads the same without it (it derives the field itself)
        if key in DERIVATION_ONLY and derived is not None and _same_reading(derived, original, key):
            continue  # the original derives nothing different from it
        if key == "head_dim" and default is None and equal(cfg[key], _implied_head_dim(cfg)):
            continue
        implied = IMPLIED.get(family, {}).get(key)
        if implied is not None and equal(cfg[key], implied(cfg)):
            continue
        raise ConfigError(f"config.json: {key} = {show(cfg[key])} is not read by mlx-lm's {family} "
                          f"(the original model's default: {show(default)}): its numbers would ignore it")


def _same_reading(a, b, key: str) -> bool:
    """Two readings of a config by the original's class agree on everything but ``key``."""
    da, db = a.to_dict(), b.to_dict()
    da.pop(key, None), db.pop(key, None)
    da.pop("transformers_version", None), db.pop("transformers_version", None)
    return equal(json.loads(json.dumps(da, default=str)), json.loads(json.dumps(db, default=str)))


def _implied_head_dim(cfg: Mapping):
    h, n = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return h // n if isinstance(h, int) and isinstance(n, int) and n > 0 else None


def _window_everywhere(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """A family that applies ``sliding_window`` only to the layers ``layer_types`` marks
    (mlx-lm's llama) given a config whose original applies it to every layer (Mistral:
    no layer_types): exact up to the window, bounded there."""
    w = cfg.get("sliding_window")
    if cfg.get("model_type") in WINDOWS_APPLIED:
        return  # (applied at module level: checkpoint/corrections/windows.py)
    if "layer_types" not in fields or "sliding_window" not in fields or cfg.get("layer_types") is not None \
            or isinstance(w, bool) or not isinstance(w, int) or w <= 0 or cfg.get("use_sliding_window") is False \
            or any(p in cfg for p in _PERIODS):  # (a pattern is given: the window is the sliding layers')
        return
    out.max_tokens = w if out.max_tokens is None else min(out.max_tokens, w)
    out.why_max = (f"config.json: sliding_window = {w} on every layer, which mlx-lm's {family} applies only to "
                   f"layers that layer_types marks sliding: its numbers are exact for prompts up to {w} tokens")


def config_fields(library: str, family: str, args: str = "ModelArgs") -> dict[str, Any] | None:
    """The fields ``family``'s dataclass ``args`` reads, with their defaults (None: required)."""
    fields = _fields(library, family, args)
    if fields is None:
        return None
    return {n: (_default(f) if _has_default(f) else None) for n, f in fields.items()}
