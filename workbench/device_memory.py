"""Bytes of memory MLX reports for its device, in one place: Metal names it ``memory_size``,
MLX's CUDA backend ``total_memory``, and the CPU reports none (0).

And the preflight: :func:`available_memory` (what a model may still take, and where the
figure comes from; ``WORKBENCH_MEMORY_AVAILABLE`` overrides it) and :func:`check_fits`,
which refuses in one line (:class:`NotEnoughMemory`) what would not fit, before anything
is read (``workbench.load``, docs/trace.md "Models larger than memory")."""
from __future__ import annotations

import os

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


# ---------------------------------------------------------------------------- preflight

#: overrides the figure :func:`available_memory` reports (a size: "8GB", "512 MiB"): lower it
#: to test the preflight without a large file, raise it to load past the check at your own risk
MEMORY_ENV = "WORKBENCH_MEMORY_AVAILABLE"


class NotEnoughMemory(MemoryError, ValueError):
    """A model (or a part of one) asks for more memory than is available, refused before
    anything is read.  A MemoryError, and a ValueError so every caller that reports unusable
    input in one line (the CLI's exit 2) reports this one too."""


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(65536).splitlines():
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_available() -> int | None:
    """What the cgroup (v2, else v1) this process runs in still allows: its limit less its use."""
    for limit, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim, cur = _read_int(limit), _read_int(used)
        if lim is not None and cur is not None and lim < 2**60:  # ("max" / a huge v1 figure: no limit)
            return max(lim - cur, 0)
    return None


def available_memory() -> tuple[int | None, str]:
    """(bytes a model may still take, where the figure comes from); (None, why) when unknown.

    Linux: ``MemAvailable`` of /proc/meminfo, lowered to what the process's cgroup still
    allows.  Elsewhere (macOS): MLX's recommended working set for the GPU, else its memory
    size.  On a GPU with memory of its own (CUDA) the lower of the host's figure and the
    device's memory.  The environment variable ``WORKBENCH_MEMORY_AVAILABLE`` (a size)
    replaces all of these."""
    env = os.environ.get(MEMORY_ENV)
    if env is not None and env.strip():
        from workbench.sizes import parse_bytes

        return parse_bytes(env, MEMORY_ENV), MEMORY_ENV
    figures = [(n, w) for n, w in ((_meminfo_available(), "MemAvailable"), (_cgroup_available(), "the cgroup's limit"))
               if n is not None]
    try:
        info = mx.device_info()
    except Exception:  # noqa: BLE001 - no device information
        info = {}
    if not figures:  # (no /proc: macOS, where the GPU shares the host's memory)
        n = int(info.get("max_recommended_working_set_size") or info.get("memory_size") or 0)
        if n:
            figures.append((n, "the device's working set"))
    gpu = int(info.get("total_memory") or 0)  # (MLX's CUDA backend: the GPU's own memory)
    if gpu:
        figures.append((gpu, "the GPU's memory"))
    if not figures:
        return None, "unknown"
    return min(figures)


def check_fits(needed: int, what: str, advice: str = "") -> None:
    """NotEnoughMemory, in one line naming ``what`` needs ``needed`` bytes, the memory
    available and ``advice``, when ``needed`` is over the memory available (nothing when
    it fits or the figure is unknown)."""
    avail, source = available_memory()
    if avail is None or needed <= avail:
        return
    from workbench.sizes import fmt_bytes

    raise NotEnoughMemory(f"{what} {needed} bytes ({fmt_bytes(needed)}), over the {fmt_bytes(avail)} of memory "
                          f"available ({source})" + (f": {advice}" if advice else ""))
