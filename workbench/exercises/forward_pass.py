"""Notebook 03 (a forward pass, op by op): the exercises, their answers and their hints."""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, array, fields, register, value


def _mean_vs_zero() -> str:
    """Notebook 03's ablation of both induction heads: mean (over 100 held-out prompts) vs zero."""
    from workbench import causal as C
    from workbench.demo import corpus

    pair = (C.head(1, 0), C.head(1, 1))
    zero = C.ablate(fx.demo(), fx.COPY_PROMPT, [pair], mode="zero").values[0]
    mean = C.ablate(fx.demo(), fx.COPY_PROMPT, [pair], mode="mean",
                    reference=[e.prompt for e in corpus.heldout(50)]).values[0]
    return "lower" if mean < zero else "higher"


def _largest_in_layer_1() -> str:
    tr = fx.trace()
    absmax = {n: tr.stats(n)["absmax"] for n in fx.demo().program.names if n.startswith("layers.1.")}
    return max(absmax, key=absmax.get)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _silu(x):
    return x / (1 + np.exp(-x))


def _mlp_case():
    tr = fx.trace()
    return (fx.v(tr, "layers.1.mlp.gate_proj"), fx.v(tr, "layers.1.mlp.up_proj")), fx.v(tr, "layers.1.mlp.act")


def _attend(p, v, kv_of_head):
    heads = [p[h] @ v[kv_of_head(h)] for h in range(p.shape[0])]    # each [T, head_dim]
    return np.concatenate(heads, axis=-1)


def _attend_case():
    tr = fx.trace()
    return (fx.v(tr, "layers.1.self_attn.softmax"), fx.v(tr, "layers.1.self_attn.v_cache")), \
        fx.v(tr, "layers.1.self_attn.context")


register(
    Exercise(
        "03.1", "predict", '"higher" or "lower"',
        value("a mean is not 'no message': it is a fixed message, written at every position",
              mistakes=[("higher", "the mean output is a typical message, the same everywhere: does it help the backup head, or override it?"),
                        ("same", "zero and mean ablation remove different things: a zero the norm rescales away, a mean it cannot")]),
        expected=lru_cache(maxsize=None)(_mean_vs_zero),
        solution="""from workbench.demo import corpus
reference = [e.prompt for e in corpus.heldout(50)]
mean = C.ablate(model, prompt, [pairs], mode="mean", reference=reference)
mean.values[0], zero.values[1]
# far lower: the heads' mean output is a typical message, the same at every position; the
# norm cannot rescale it away as it rescales a zero, so it overrides the backup head"""),
    Exercise(
        "03.2", "predict", 'an op name, e.g. "layers.1.self_attn.q_proj"',
        value("compare tr.stats(name)['absmax'] of the layer's ops: which outputs are not normed?",
              mistakes=[(n, "the MLP is the right place: which of its ops is summed over all 384 channels and not normed?")
                        for n in ("layers.1.mlp.act", "layers.1.mlp.gate_proj", "layers.1.mlp.up_proj")]
              + [("layers.1", "layers.1 is the residual stream after the layer; the question asks for an op inside it (layers.1.<something>)")]),
        expected=_largest_in_layer_1,
        solution="""absmax = {n: tr.stats(n)["absmax"] for n in model.program.names if n.startswith("layers.1.")}
max(absmax, key=absmax.get)
# the MLP's raw output, before post_feedforward_layernorm brings it back to the stream's
# scale: outputs of a norm stay near the norm's weights; the widened-and-narrowed MLP output does not"""),
    Exercise(
        "03.3", "predict", "a tuple (batch, heads, tokens, head dimension)",
        fields(("batch", "heads", "tokens", "head dimension"),
               ("one prompt", "queries have num_attention_heads heads", "count <bos> too",
                "layers.3 is the full-attention layer: which head size does the config give full attention?"),
               mistakes=[((1, 4, 10, 32), "32 is head_dim, the sliding layers' head size; the full-attention layer has its own"),
                        ((1, 2, 10, 64), "2 is num_key_value_heads: queries have num_attention_heads heads"),
                        ((1, 4, 9, 64), "count <bos> too")]),
        expected=lambda: tuple(fx.trace().step_info("layers.3.self_attn.q_rope").output_shape),
        solution="""tuple(tr.step_info("layers.3.self_attn.q_rope").output_shape)
# one sequence, num_attention_heads rows, one per token (<bos> and the prompt's 9), and the
# full-attention layer's own head size, global_head_dim, twice the sliding layers' head_dim""",
        giveaways=("(1, 4, 10, 64)",)),
    Exercise(
        "03.4", "implement", "a function mlp_act(gate, up) returning an array shaped like gate",
        array("tokens", "Gemma's MLP is gated: an activation of the gate, times up",
              mistakes=[(lambda g, u: np.maximum(g, 0) * u,
                         "gated the right way, but the activation is wrong: that is ReLU; Gemma uses GELU, in its tanh approximation"),
                        (lambda g, u: _silu(g) * u, "that is SiLU (Llama's gate); Gemma uses GELU in its tanh approximation"),
                        (lambda g, u: gelu_tanh(u) * g, "gate and up are swapped: the activation goes on the gate"),
                        (lambda g, u: gelu_tanh(g), "the activation is right; now multiply by up"),
                        (lambda g, u: _gelu_erf(g) * u, "close: that is the exact (erf) GELU; Gemma uses the tanh approximation")],
              rtol=1e-4, atol=1e-5),
        case=_mlp_case,
        solution="""def mlp_act(gate, up):
    gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
    return gelu * up""",
        giveaways=("0.044715", "gelu(g) * u")),
    Exercise(
        "03.5", "implement", "a function attend(p, v) returning the context, [tokens, heads x head_dim]",
        array("tokens", "each head's context is its weights times its values, [T, T] @ [T, head_dim]; then the heads side by side",
              mistakes=[(lambda p, v: _attend(p, v, lambda h: h % v.shape[0]),
                         "query heads share key/value heads in *blocks*: heads 0 and 1 read value head 0 (h // group), not h % 2"),
                        (lambda p, v: _attend(p.transpose(0, 2, 1), v, lambda h: h // (p.shape[0] // v.shape[0])),
                         "p is [query, key]: a query's row of weights multiplies the values, p @ v, not p.T @ v")]),
        case=_attend_case,
        solution="""def attend(p, v):
    group = p.shape[0] // v.shape[0]                      # query heads per key/value head (GQA)
    heads = [p[h] @ v[h // group] for h in range(p.shape[0])]
    return np.concatenate(heads, axis=-1)                 # [T, heads * head_dim]"""),
)
