"""The mixture-of-experts variant of the demo model (``assets/demo-moe``).

Gemma 4's MoE decoder layer runs the dense MLP *and* a routed expert block side by side:

    h1 = post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h)))
    h2 = post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(h), router(h)))
    h  = h + post_feedforward_layernorm(h1 + h2)

The variant is *upcycled* from the trained dense demo model: every dense weight is
copied, the router and the 4 experts (top-2 routing, SwitchGLU with GeGLU) start random
with ``post_feedforward_layernorm_2`` scaled down, and the whole model is then trained
briefly (a few hundred steps, seeded) on the same corpus so that the experts and router
carry real, trained weights.
"""
from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

MOE_KEYS = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 64}


def upcycle(dense_path: Path):
    """A gemma4_text MoE model (mlx-lm's class) holding the dense demo model's weights."""
    from workbench.demo.loading import build_model, load_mlx_lm

    dense, cfg = load_mlx_lm(dense_path)
    cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    cfg.update(MOE_KEYS)
    moe = build_model(cfg)
    dense_w = {k: v.astype(mx.float32) for k, v in tree_flatten(dense.parameters())}
    new = dict(tree_flatten(moe.parameters()))
    for k, v in dense_w.items():
        if k not in new or new[k].shape != v.shape:
            raise ValueError(f"upcycle: dense weight {k} has no place in the MoE model")
        new[k] = v
    for k in new:
        if k.endswith("post_feedforward_layernorm_2.weight"):
            new[k] = mx.full(new[k].shape, 0.1)
    moe.update(tree_unflatten(list(new.items())))
    return moe, cfg
