"""Where an mlx-lm family computes something other than what its config and its original say.

(Beside the reader, below it nothing: inspect builds the reference's model as loading does
(reference_arch.py) and so corrects it as loading does; workbench/reference/ only uses it.)

mlx-lm is a reference, not ground truth: checked against transformers + torch
(tests/test_arch_refs.py), a few families hard-code a choice their checkpoints do not make.
:func:`correct` mends each one on the built model (before it is instrumented), so module
traces carry the original's numbers; :func:`model_class` gives a family's model class the
structural corrections that must precede the weights (a module the original does not have).
Each entry: what mlx-lm does, what transformers does, the error vs torch's logits (max |diff| /
max |logit|, float32, tests/data/archs) before -> after.

* **the MLP activation** (activation.py): StarCoder 2 and GPTBigCode call the exact (erf) GELU
  where their checkpoints say ``gelu_pytorch_tanh``, GPT-NeoX the tanh approximation where
  Pythia says ``gelu``, Gemma the exact GELU where transformers' default is
  ``gelu_pytorch_tanh``: up to ~2e-4 of a logit.  Each such MLP gets the activation the
  original runs, as its config class reads the config (transformers' GemmaConfig reads Gemma 1's
  published ``hidden_act: "gelu"`` as ``gelu_pytorch_tanh``: 5.9e-5 -> 2.2e-7); an activation
  this table does not know is refused by name.
* **Gemma 3's embedding scale** (activation.py): mlx-lm multiplies by sqrt(hidden) rounded to
  bfloat16 in every dtype; transformers rounds it to the compute dtype (exact in float32:
  5.8e-4 of a logit at hidden 80).  The embedding's output is multiplied by the ratio, so the
  product is the original's (the ``embed_tokens`` step then holds the embedding times that
  ratio, within 0.2% of one).
* **YaRN** (rope.py, mlx-lm's ``YarnRoPE``): mlx-lm always rounds the correction range
  outward; transformers rounds it only where ``truncate`` is not false (gpt-oss publishes
  ``"truncate": false``: 1e-3 of a logit at 12 tokens), and takes ``attention_factor`` when the
  config gives one.  Its frequencies and attention factor are recomputed with transformers'
  formulas (workbench/rope.py, the op programs' own).
* **LongRoPE** (rope.py, mlx-lm's ``SuScaledRoPE``, Phi-3/3.5): mlx-lm always uses
  ``long_factor``; transformers uses ``short_factor`` while the sequence (offset + new tokens)
  is at most ``original_max_position_embeddings``, and ``long_factor`` past it (0.36 of a logit
  on a short prompt); its attention factor is the config's ``attention_factor``, else from
  ``factor``, else from max / original positions.  The rotation picks its factors per call as
  transformers does.
* **Phi-3.5-MoE's LongRoPE** (rope.py, phimoe): mlx-lm rotates with ``long_factor`` scaled by
  ``long_mscale``; transformers' ``PhimoeRotaryEmbedding`` computes its frequencies without the
  sequence length, so with ``short_factor`` at every length, and scales by ``short_mscale`` up
  to ``original_max_position_embeddings``, ``long_mscale`` past it: 0.87 -> 1.0e-6 of a logit
  on 12 tokens, under (64) and over (8) the original length alike.  (Microsoft's own remote code
  switched to ``long_factor`` past it; transformers is the reference here.)
* **Jamba's routing** (routing.py, mlx-lm's ``JambaSparseMoeBlock``): mlx-lm takes the softmax
  over the top-k router logits only (the chosen weights renormalised to sum to one);
  transformers' ``JambaTopKRouter`` takes it over all experts and keeps the top-k probabilities
  as they are (0.26 of a logit with 4 experts, top 2).  The block routes as transformers does.
* **Qwen2-MoE's norm_topk_prob** (routing.py): mlx-lm's qwen2_moe never reads it (the reader
  refused ``true``); transformers' ``Qwen2MoeTopKRouter`` divides the top-k weights by their
  sum when it is true: 0.20 -> 8.6e-7 of a logit (4 experts, top 2).
* **HunYuan-MoE** (routing.py, hunyuan.py; refused before: registry.ELSEWHERE now maps
  ``hunyuan_v1_moe`` to mlx-lm's ``hunyuan``): mlx-lm weights the top-k experts by their softmax
  probabilities as they are; transformers' ``HunYuanMoEV1Gate`` divides them by their sum, and its
  shared MLP is always added (0.19 -> 7.8e-7 of a logit, 4 experts, top 2).  mlx-lm also builds a
  plain MLP for one expert (transformers' default, which still routes: gate, expert, shared MLP)
  and always ties the head (the original reads ``tie_word_embeddings``, false by default): a
  failed load ("Received 14 parameters not in model") -> 8.5e-7 with one expert, a tied head and
  Hunyuan-A13B's NTK-alpha RoPE (alpha 1000: 0.83 if it were read as plain RoPE).  The reader
  fills the options the original does not have at what it computes (one shared MLP, q/k norms, no
  cross-layer attention, experts of ``intermediate_size``) and refuses another value by name; its
  RoPE is mlx-lm's NTK-alpha form (plain RoPE: alpha 1; linear or dynamic-NTK scaling refused).
* **ERNIE 4.5 MoE's balancing bias** (routing.py; refused before): mlx-lm's sanitize drops
  ``moe_statics.e_score_correction_bias``; transformers' ``Ernie4_5_MoeTopKRouter`` picks the top-k
  experts by softmax + bias and weights them by the softmax alone over their sum (at least
  ``moe_norm_min``): 0.51 -> 1.2e-6 (4 experts, top 2, the fixture's bias non-zero).  Each block
  gets the bias back (its own name); a checkpoint without it (mlx-lm's conversions) is refused
  naming the missing tensor.  ``moe_gate_act`` (no option of the original), ``moe_capacity`` and
  ``moe_use_aux_free`` (read by neither) cannot change the corrected numbers.
* **AFMoE's router** (routing.py; one expert a token was refused): mlx-lm divides the top-k
  sigmoid scores by their sum only for k > 1 and reads ``route_norm`` / ``score_func`` / ``n_group``
  / ``topk_group``; transformers' ``AfmoeTokenChoiceRouter`` always divides (weight 1 for one
  expert, times ``route_scale``) and has none of those options: 0.12 -> 8.0e-7 (top 1 of 4).
* **Jamba's expert layers** (the reader, reference_config.REMEANT): transformers puts experts on
  the layers with ``i % expert_layer_period == expert_layer_offset``, mlx-lm on those with
  ``(i + offset) % period == 0`` -- the same layers for periods 1 and 2 only; mlx-lm is given the
  offset that means the original's layers (period 3, offset 1, 5 layers: a failed load -> 5.8e-6,
  three Mamba layers' float32 sums).
* **Nemotron-H's window** (the reader, reference_config.WINDOW_UNREAD): NemotronHConfig declares a
  ``sliding_window`` nothing reads (its masks are full causal, its cache follows layer_types; torch's
  logits with window 4 and without are identical); the reader capped prompts at it: refused past
  4 tokens -> 7.6e-7 on 12.
* **Sliding windows** (windows.py): mlx-lm's gemma2, mixtral, phi3, phimoe and starcoder2
  never apply the config's ``sliding_window``, and its llama (which builds Mistral) applies it
  only to layers ``layer_types`` marks, which Mistral's config has not; the reader capped
  prompts at the window (Qwen2 / Qwen2-MoE / Qwen3 with ``use_sliding_window: true`` it refused:
  mlx-lm's qwen2, qwen2_moe and qwen3 apply no window).  Each layer the original slides (every layer; Gemma 2: its
  ``layer_types``) masks as transformers' ``sliding_window_causal_mask_function`` does
  (query i sees keys i - window < j <= i), from its own KV cache, so decoding steps past the
  window are masked too: 12 tokens, window 4 (the first 4 positions were exact), before ->
  after: gemma2 0.44 -> 2.8e-7, mistral 1.28 -> 8.1e-7, mixtral 1.14 -> 1.1e-6, phi3 1.04 ->
  5.2e-7, phimoe 1.15 -> 8.1e-7, starcoder2 0.91 -> 6.5e-7; Qwen's layers as its config class
  derives them from ``max_window_layers`` (Qwen2 / Qwen3 from it on, Qwen2-MoE the even layers
  below it), mlx-lm's numbers (unwindowed) -> corrected: qwen2 0.84 -> 7.2e-7, qwen3 0.72 ->
  8.1e-7, qwen2_moe 1.0 -> 1.0e-6; decoding with the KV cache past the window alike.
* **Gemma 3n's KV-shared layers** (gemma3n.py): the last ``num_kv_shared_layers`` layers have
  no k/v weights in what transformers writes (mlx-lm's strict load failed: "Missing 12
  parameters") and attend over this forward's k/v of the last earlier layer of their kind,
  cache or not (mlx-lm, with no cache, had them compute their own).  E2B-shaped (10 layers,
  4 shared, 0.95 activation sparsity on the first 4): load failure -> 3.1e-6.  (mlx-lm's
  Gaussian top-k on the MLP gate is transformers' ``_gaussian_topk``: no correction.)

Checked and found to be the original's (no correction; fixtures in tests/data/archs): dynamic
NTK RoPE (mlx-lm's ``DynamicNTKScalingRoPE`` recomputes the base from offset + new tokens as
transformers' ``dynamic_rope_update`` does: 8.2e-7 on a 12-token prompt past
max_position_embeddings 8, where plain RoPE would be 0.11; the op programs still refuse the
type by name), GPT-BigCode's ``n_inner: null`` (4 x n_embd, filled by the reader: 5.4e-7),
Nemotron-H (once the reader decodes transformers' tagged ``Infinity``: 7.6e-7), Ministral
(built by mlx-lm's llama, which windows the layers its layer_types marks: 7.7e-7, cached
decoding alike).  Families not listed read their activation from the config themselves, or
were checked against torch at transformers' default.  Checked and left refused: OLMo (1) --
mlx-lm's olmo reads ai2-olmo's own format (``d_model``, a fused ``att_proj``), not the
checkpoints transformers writes (``hidden_size``, q/k/v projections, ``clip_qkv``), so even
with ai2-olmo installed it would not build them; the refusal names the package it exits on.
"""
from __future__ import annotations

from typing import Mapping

import mlx.nn as nn

from workbench.errors import ConfigError  # (what mlx-lm computes differently, and cannot be corrected)
from workbench.checkpoint.corrections import activation, gemma3n, hunyuan, rope, routing, windows

__all__ = ["ConfigError", "correct", "model_class"]

#: families with a correction that must come before the weights load -> (what it does to the
#: built model, what it drops from the sanitized weights)
_STRUCTURAL = {"gemma3n": (gemma3n.prepare, gemma3n.unread),
               "hunyuan": (hunyuan.prepare, lambda model, weights: weights),
               "ernie4_5_moe": (routing.ernie4_5_moe_prepare, lambda model, weights: weights)}


def correct(model: nn.Module, family: str, config: Mapping) -> None:
    """Apply the corrections to ``model`` (an mlx-lm ``family`` built from ``config``)."""
    activation.apply(model, family, config)
    rope.apply(model, family)
    if family == "jamba":
        routing.jamba(model)
    if family == "qwen2_moe":
        routing.qwen2_moe(model, config)
    if family == "afmoe":
        routing.afmoe(model)
    if family == "ernie4_5_moe":
        routing.ernie4_5_moe(model, config)
    if family == "hunyuan":
        hunyuan.prepare(model)
        routing.hunyuan(model, config)
    if family == "gemma3n":
        gemma3n.apply(model)
    windows.apply(model, config)
    if family == "gemma3_text" or (family == "gemma3" and isinstance(config.get("text_config"), Mapping)):
        tc = config.get("text_config") if family == "gemma3" else config
        activation.gemma3_embed_scale(model, tc.get("hidden_size"))


def model_class(cls: type, family: str) -> type:
    """``cls`` (mlx-lm's ``Model`` of ``family``) whose instances, once built, lose what the
    original does not have (before strict weight loading); ``cls`` itself where nothing does."""
    if family not in _STRUCTURAL:
        return cls
    prepare, unread = _STRUCTURAL[family]

    def init(self, *args, **kw):
        cls.__init__(self, *args, **kw)
        prepare(self)

    def sanitize(self, weights):
        parent = getattr(cls, "sanitize", None)
        return unread(self, parent(self, weights) if parent is not None else weights)

    return type(cls.__name__, (cls,), {"__init__": init, "sanitize": sanitize, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})
