"""Qwen3 (dense): Llama's config and tensors, plus q_norm / k_norm per layer (mlx-lm's
models/qwen3.py names).  The op program is workbench/models/qwen3.py."""
from __future__ import annotations

from dataclasses import dataclass

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.families import llama

FAMILY = "qwen3"
MODEL_TYPES = registry.model_types(FAMILY)
#: config.json keys this family reads, knowingly ignores, or reads at given values only
KEYS = F.Keys(handled=frozenset(F.DENSE_KEYS), only={"hidden_act": ("silu",), "partial_rotary_factor": (1.0,)})


@dataclass
class Config(llama.Config):
    """Llama's fields (``rope_traditional`` stays False); sliding layers (transformers'
    use_sliding_window / max_window_layers, or layer_types) attend within sliding_window."""


def read(tc: dict) -> Config:
    """Llama's reader, with Qwen 3's defaults (rms_norm_eps 1e-6, untied, no rope_theta default)."""
    return llama.read(tc, FAMILY, Config)


def tensors(cfg: Config, a: F.Arch) -> None:
    """Llama's tensors plus q_norm / k_norm."""
    llama.tensors(cfg, a, qk_norm=True)
