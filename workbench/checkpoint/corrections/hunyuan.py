"""HunYuan-MoE's modules as transformers' HunYuanMoEV1 builds them, on mlx-lm's hunyuan (see the
package doc; its routing: routing.py).

mlx-lm's hunyuan builds a plain MLP where ``num_experts == 1`` (transformers' default), where
``HunYuanMoEV1Moe`` still routes: a gate, the one expert, the shared MLP (what
``save_pretrained`` writes); and it always ties the output head to the embedding, where the
original reads ``tie_word_embeddings`` (false by default: an ``lm_head`` of its own).  Both are
mended before the weights load, so mlx-lm's strict load reads what transformers wrote.
"""
from __future__ import annotations

import mlx.nn as nn

from workbench.checkpoint.corrections.common import subclass


def _original(model: nn.Module):
    """The built model's arguments when it is transformers' HunYuanMoEV1 (model_type
    hunyuan_v1_moe: mlx-lm's other hunyuan checkpoints are left as they are), else None."""
    args = getattr(model, "args", None)
    return args if getattr(args, "model_type", None) == "hunyuan_v1_moe" else None


def prepare(model: nn.Module) -> None:
    """Before the weights load: every layer a mixture block, an untied head (idempotent)."""
    from mlx_lm.models.hunyuan import MoeBlock

    args = _original(model)
    if args is None:
        return
    for i, layer in enumerate(model.layers):
        if not isinstance(layer.mlp, MoeBlock):
            layer.mlp = MoeBlock(args, i)
    if args.tie_word_embeddings is False and "lm_head" not in model:
        model.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

        def attrs(base):
            def call(self, inputs, cache=None):
                return self.lm_head(self.model(inputs, cache))
            return {"__call__": call}

        subclass(model, {}, attrs)

