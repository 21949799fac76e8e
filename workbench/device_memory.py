"""Bytes of memory MLX reports for its device, in one place: Metal names it ``memory_size``,
MLX's CUDA backend ``total_memory``, and the CPU reports none (0)."""
from __future__ import annotations

import mlx.core as mx

#: str(device) -> bytes.  Keyed by the name: MLX makes a new Device object on every
#: ``mx.default_device()`` and hashes it by identity, so a cache keyed by the object never hits
#: (on CUDA every miss asked NVML: 20 us, in every attention op of every decoding step)
_KNOWN: dict[str, int] = {}


def ask_device_memory(device) -> int:
    """Bytes of memory MLX reports for ``device`` (0: none reported), asked now."""
    try:
        info = mx.device_info()
        return int(info.get("memory_size") or info.get("total_memory") or 0)
    except Exception:  # noqa: BLE001 - no device information: the caller's fixed default
        return 0


def device_memory(device) -> int:
    """:func:`ask_device_memory`, asked once per device (MLX's CUDA backend queries NVML on
    every call, and every trace makes a store and every attention op asks)."""
    key = str(device)
    n = _KNOWN.get(key)
    if n is None:
        n = _KNOWN[key] = ask_device_memory(device)
    return n
