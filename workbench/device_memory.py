"""Bytes of memory MLX reports for its device, in one place: Metal names it ``memory_size``,
MLX's CUDA backend ``total_memory``, and the CPU reports none (0)."""
from __future__ import annotations

import functools

import mlx.core as mx


@functools.lru_cache(maxsize=4)
def device_memory(device) -> int:
    """Bytes of memory MLX reports for ``device`` (0: none reported), asked once per device
    (MLX's CUDA backend queries NVML on every call, and every trace makes a store)."""
    try:
        info = mx.device_info()
        return int(info.get("memory_size") or info.get("total_memory") or 0)
    except Exception:  # noqa: BLE001 - no device information: the caller's fixed default
        return 0
