"""Where an mlx-lm family computes something other than what its config and its original say.

mlx-lm is a reference, not ground truth: checked against transformers + torch
(tests/test_arch_refs.py), a few families hard-code a choice their checkpoints do not make.
:func:`correct` mends each one on the built model (before it is instrumented), so module
traces carry the original's numbers:

* **the MLP activation**: StarCoder 2 and GPTBigCode call the exact (erf) GELU where their
  checkpoints say ``gelu_pytorch_tanh``, GPT-NeoX the tanh approximation where Pythia says
  ``gelu``, Gemma the exact GELU where transformers' default is ``gelu_pytorch_tanh``: up to
  ~2e-4 of a logit.  Each such MLP gets the activation its config names; an activation this
  table does not know is refused by name.
* **Gemma 3's embedding scale**: mlx-lm multiplies by sqrt(hidden) rounded to bfloat16 in
  every dtype; transformers rounds it to the compute dtype (exact in float32: 5.8e-4 of a
  logit at hidden 80).  The embedding's output is multiplied by the ratio, so the product is
  the original's (the ``embed_tokens`` step then holds the embedding times that ratio,
  within 0.2% of one).
* **YaRN** (mlx-lm's ``YarnRoPE``): mlx-lm always rounds the correction range outward;
  transformers rounds it only where ``truncate`` is not false (gpt-oss publishes
  ``"truncate": false``: 1e-3 of a logit at 12 tokens), and takes ``attention_factor`` when the
  config gives one.  Its frequencies and attention factor are recomputed with transformers'
  formulas (workbench/models/rope.py, the op programs' own).
* **LongRoPE** (mlx-lm's ``SuScaledRoPE``, Phi-3/3.5): mlx-lm always uses ``long_factor``;
  transformers uses ``short_factor`` while the sequence (offset + new tokens) is at most
  ``original_max_position_embeddings``, and ``long_factor`` past it (0.36 of a logit on a
  short prompt); its attention factor is the config's ``attention_factor``, else from
  ``factor``, else from max / original positions.  The rotation picks its factors per call
  as transformers does.  (Phi-3.5-MoE's ``short_mscale`` / ``long_mscale`` form is left as
  mlx-lm computes it: no fixture proves a change.)
* **Jamba's routing** (mlx-lm's ``JambaSparseMoeBlock``): mlx-lm takes the softmax over the
  top-k router logits only (the chosen weights renormalised to sum to one); transformers'
  ``JambaTopKRouter`` takes it over all experts and keeps the top-k probabilities as they are
  (0.26 of a logit with 4 experts, top 2).  The block routes as transformers does.

Families not listed read their activation from the config themselves, or were checked
against torch at transformers' default.
"""
from __future__ import annotations

from typing import Mapping

import math

import mlx.core as mx
import mlx.nn as nn

from workbench.errors import ConfigError  # (what mlx-lm computes differently, and cannot be corrected)

#: config activation name -> MLX function (the tanh forms are one formula)
ACTIVATIONS = {"gelu": nn.gelu, "gelu_pytorch_tanh": nn.gelu_approx, "gelu_new": nn.gelu_approx,
               "gelu_fast": nn.gelu_approx, "silu": nn.silu, "swish": nn.silu}

#: family -> (MLP class name, its call with the activation as a parameter, what mlx-lm calls)
_PLAIN = lambda fc, out: (lambda m, x, act: getattr(m, out)(act(getattr(m, fc)(x))))  # noqa: E731
_GATED = lambda m, x, act: m.down_proj(act(m.gate_proj(x)) * m.up_proj(x))  # noqa: E731
FAMILIES = {
    "starcoder2": ("MLP", _PLAIN("c_fc", "c_proj"), "gelu"),
    "gpt_bigcode": ("MLP", _PLAIN("c_fc", "c_proj"), "gelu"),
    "gpt_neox": ("MLP", _PLAIN("dense_h_to_4h", "dense_4h_to_h"), "gelu_pytorch_tanh"),
    "gemma": ("MLP", _GATED, "gelu"),
}
_KEYS = ("hidden_activation", "hidden_act", "activation_function")


def configured(config: Mapping) -> str | None:
    for k in _KEYS:
        if isinstance(config.get(k), str):
            return config[k]
    return None


def correct(model: nn.Module, family: str, config: Mapping) -> None:
    """Apply this module's corrections to ``model`` (an mlx-lm ``family`` built from ``config``)."""
    _activation(model, family, config)
    _rope(model)
    if family == "jamba":
        _jamba_routing(model)
    if family == "gemma3_text" or (family == "gemma3" and isinstance(config.get("text_config"), Mapping)):
        tc = config.get("text_config") if family == "gemma3" else config
        _gemma3_embed_scale(model, tc.get("hidden_size"))


def _subclass(m: nn.Module, cache: dict, make_attrs) -> None:
    """Give module ``m`` a subclass of its class (same name, one per class) overriding the
    attributes ``make_attrs(base class)`` returns."""
    base = type(m)
    if base not in cache:
        cache[base] = type(base.__name__, (base,), {**make_attrs(base), "__module__": base.__module__,
                                                    "__qualname__": base.__qualname__})
    m.__class__ = cache[base]


def _gemma3_embed_scale(model: nn.Module, hidden) -> None:
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        return
    s = hidden ** 0.5

    def attrs(base):
        def call(self, x):
            e = base.__call__(self, x)
            return e * (mx.array(s, e.dtype) / mx.array(s, mx.bfloat16).astype(e.dtype))
        return {"__call__": call}

    fixed: dict = {}
    for path, m in model.named_modules():
        if path.endswith("embed_tokens") and isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)):
            _subclass(m, fixed, attrs)


def _activation(model: nn.Module, family: str, config: Mapping) -> str | None:
    """Give ``family``'s MLPs the activation ``config`` names when mlx-lm hard-codes another;
    the name applied (None: nothing to correct)."""
    spec = FAMILIES.get(family)
    name = configured(config)
    if spec is None or name is None:
        return None
    cls_name, call, builtin = spec
    if name not in ACTIVATIONS:
        raise ConfigError(f"config.json: activation {name!r} is not one workbench knows for mlx-lm's {family} "
                          f"(known: {', '.join(ACTIVATIONS)})")
    if ACTIVATIONS[name] is ACTIVATIONS[builtin]:
        return None
    act = ACTIVATIONS[name]
    fixed: dict = {}
    for _, m in model.named_modules():
        if type(m).__name__ == cls_name:
            _subclass(m, fixed, lambda base: {"__call__": lambda self, x: call(self, x, act)})
    return name


def _rope(model: nn.Module) -> None:
    """mlx-lm's YaRN and LongRoPE modules given transformers' numbers (see the module doc),
    from the arguments the family was built with (the normalised config)."""
    from mlx_lm.models.rope_utils import SuScaledRoPE, YarnRoPE

    args = getattr(model, "args", None)
    scaling = getattr(args, "rope_scaling", None)
    if not isinstance(scaling, Mapping):
        return
    kind = scaling.get("rope_type", scaling.get("type"))
    fixed: dict = {}
    yarns = 0
    for _, m in model.named_modules():
        if isinstance(m, YarnRoPE) and kind == "yarn":
            _yarn(m, args, scaling)
            yarns += 1
        elif isinstance(m, SuScaledRoPE) and kind in ("longrope", "su") \
                and "short_mscale" not in scaling and "long_mscale" not in scaling:
            _longrope(m, args, scaling, fixed)
    if kind == "yarn" and not yarns and scaling.get("truncate", True) is not True:
        raise ConfigError(f"config.json: rope_scaling.truncate = {scaling['truncate']!r}, which mlx-lm's "
                          f"{type(model).__module__.rsplit('.', 1)[-1]} does not read (its YaRN always truncates)")


def _number(args, name: str) -> float:
    v = getattr(args, name, None)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ConfigError(f"config.json: {name} = {v!r} is not a positive number")
    return float(v)


def _yarn(m: nn.Module, args, scaling: Mapping) -> None:
    """transformers' YaRN frequencies (``truncate`` read) and attention factor on ``m``."""
    from workbench.models.rope import rope_params

    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConfigError(f"config.json: rope_scaling.truncate = {truncate!r} is not true or false")
    factor = scaling.get("factor")
    orig = scaling.get("original_max_position_embeddings")
    if factor is None and orig:
        factor = _number(args, "max_position_embeddings") / orig
    r = {"rope_type": "yarn", "rope_theta": _number(args, "rope_theta"), "factor": factor,
         "original_max_position_embeddings": orig, "truncate": truncate,
         "beta_fast": scaling.get("beta_fast") or 32, "beta_slow": scaling.get("beta_slow") or 1,
         "attention_factor": scaling.get("attention_factor"), "mscale": scaling.get("mscale"),
         "mscale_all_dim": scaling.get("mscale_all_dim")}
    p = rope_params(m.dims, r)
    m._freqs, m.mscale = p["freqs"], float(p["mscale"])


def _longrope(m: nn.Module, args, scaling: Mapping, cache: dict) -> None:
    """``m`` rotates with short_factor up to original_max_position_embeddings positions, with
    long_factor past them, both scaled by transformers' attention factor."""
    orig = m.original_max_position_embeddings
    exps = _number(args, "rope_theta") ** (mx.arange(0, m.dim, 2, dtype=mx.float32) / m.dim)
    factors = {}
    for key in ("short_factor", "long_factor"):
        f = scaling.get(key)
        if not isinstance(f, (list, tuple)) or len(f) != m.dim // 2:
            raise ConfigError(f"config.json: rope_scaling.{key} must be {m.dim // 2} numbers (one per rotated "
                              f"frequency), got {f!r}"[:200])
        factors[key] = mx.array(f, dtype=mx.float32) * exps
    attention = scaling.get("attention_factor")
    if attention is None:
        factor = scaling.get("factor") or _number(args, "max_position_embeddings") / orig
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    m._short_freqs, m._freqs, m._scale = factors["short_factor"], factors["long_factor"], float(attention)

    def attrs(base):
        def call(self, x, offset=0):
            start = int(mx.max(offset).item()) if isinstance(offset, mx.array) else int(offset)
            long = start + x.shape[-2] > self.original_max_position_embeddings
            return mx.fast.rope(x.at[..., : self.dim].multiply(self._scale), self.dim, traditional=False,
                                base=None, scale=1.0, offset=offset,
                                freqs=self._freqs if long else self._short_freqs)
        return {"__call__": call}

    _subclass(m, cache, attrs)


def _jamba_routing(model: nn.Module) -> None:
    """mlx-lm's Jamba MoE blocks weight their top-k experts by the softmax over all experts,
    unrenormalised (transformers' ``JambaTopKRouter``), not by the softmax over the top k."""
    def attrs(base):
        def call(self, x):
            gates = self.router(x)
            k = self.num_experts_per_tok
            probs = mx.softmax(gates.astype(mx.float32), axis=-1)
            inds = mx.stop_gradient(mx.argpartition(-probs, kth=k - 1, axis=-1)[..., :k])
            scores = mx.take_along_axis(probs, inds, axis=-1).astype(x.dtype)
            y = self.switch_mlp(x, inds)
            return (y * scores[..., None]).sum(axis=-2)
        return {"__call__": call}

    fixed: dict = {}
    for _, m in model.named_modules():
        if type(m).__name__ == "JambaSparseMoeBlock":
            _subclass(m, fixed, attrs)
