"""Captured op outputs within a memory budget, spilling to safetensors on disk beyond it.

Values are kept in memory (as evaluated MLX arrays) until their total size passes the
budget; then the oldest ones are written, one ``.safetensors`` file each, into a
private temporary directory (made inside ``spill_dir`` if given; created exclusively,
mode 0700) and dropped from memory.  Reading a spilled value loads it back
(memory-mapped by MLX).  The directory is removed when the store is garbage collected or
:meth:`close`\\ d, and on SIGTERM / SIGINT; nothing is written anywhere else.  Free disk
space is checked before each spill: a value that would not fit (with a margin) raises
:class:`SpillError` naming the directory, the space needed and the space left.
"""
from __future__ import annotations

import os
import shutil
import weakref
from collections import OrderedDict

import mlx.core as mx

from workbench import fsio
from workbench.device_memory import device_memory
from workbench.sizes import parse_bytes

#: captured bytes kept in memory when no budget is given, unless the device says it has more
#: room (:func:`default_budget`); ``WORKBENCH_CAPTURE_BUDGET`` overrides both
DEFAULT_BUDGET = 2 * 2**30


def default_budget() -> int:
    """The capture budget when none is given: ``WORKBENCH_CAPTURE_BUDGET`` if set, else a
    quarter of the accelerator's memory where MLX reports it (a GPU: a full capture of a
    4096-token E2B forward, 22 GB, stays on an H200's 141 GB instead of spilling), at least
    :data:`DEFAULT_BUDGET` (the CPU: MLX reports no memory size)."""
    env = os.environ.get("WORKBENCH_CAPTURE_BUDGET")
    if env:
        return parse_bytes(env, "WORKBENCH_CAPTURE_BUDGET")
    return max(DEFAULT_BUDGET, device_memory(mx.default_device()) // 4)


#: free space left on the spill filesystem after a spill (bytes)
SPILL_MARGIN = 256 * 2**20


class SpillError(fsio.WriteError):
    """A captured value could not be spilled to disk (no space, unwritable directory)."""


def _remove_dir(d: str) -> None:
    fsio.unregister(d)
    shutil.rmtree(d, True)


class ValueStore:
    def __init__(self, budget: int | None = None, spill_dir: str | None = None):
        self.budget = default_budget() if budget is None else (
            int(budget) if isinstance(budget, int) and budget >= 0 else parse_bytes(budget, "memory_budget"))
        self._mem: OrderedDict[str, mx.array] = OrderedDict()
        self._disk: dict[str, str] = {}
        self._bytes = 0
        self._spill_root = spill_dir
        self._dir: str | None = None
        self._n = 0
        self._finalizer = None

    # -- public
    def __contains__(self, name: str) -> bool:
        return name in self._mem or name in self._disk

    def __len__(self) -> int:
        return len(self._mem) + len(self._disk)

    @property
    def memory_bytes(self) -> int:
        return self._bytes

    @property
    def spilled(self) -> list[str]:
        return list(self._disk)

    @property
    def directory(self) -> str | None:
        return self._dir

    def put(self, name: str, value: mx.array) -> None:
        """Keep an (evaluated) value; spill the oldest ones when over budget."""
        self.remove(name)
        self._mem[name] = value
        self._bytes += value.nbytes
        while self._bytes > self.budget and self._mem:
            old, arr = self._mem.popitem(last=False)
            self._bytes -= arr.nbytes
            self._spill(old, arr)

    def get(self, name: str) -> mx.array:
        v = self._mem.get(name)
        if v is not None:
            return v
        path = self._disk.get(name)
        if path is None:
            raise KeyError(name)
        return mx.load(path)["value"]

    def remove(self, name: str) -> None:
        v = self._mem.pop(name, None)
        if v is not None:
            self._bytes -= v.nbytes
        path = self._disk.pop(name, None)
        if path is not None:
            try:
                os.remove(path)
            except OSError:
                pass

    def close(self) -> None:
        self._mem.clear()
        self._disk.clear()
        self._bytes = 0
        if self._finalizer is not None:
            self._finalizer()

    # -- internals
    def _spill(self, name: str, value: mx.array) -> None:
        if self._dir is None:
            if self._spill_root is not None:
                try:
                    os.makedirs(self._spill_root, exist_ok=True)
                except OSError as e:
                    raise SpillError(f"capture spill directory {self._spill_root}: cannot be created "
                                     f"({e.strerror or e})") from None
            try:
                self._dir = fsio.private_dir(self._spill_root, prefix="workbench-trace-")
            except fsio.WriteError as e:
                raise SpillError(f"full capture needs to spill to disk: {e}") from None
            self._finalizer = weakref.finalize(self, _remove_dir, self._dir)
        need = value.nbytes + 4096
        free = fsio.free_bytes(self._dir)
        if free is not None and free < need + SPILL_MARGIN:
            raise SpillError(f"full capture: spilling {name!r} ({need / 2**20:.1f} MiB) to {self._dir} would leave "
                             f"less than {SPILL_MARGIN / 2**20:.0f} MiB free ({free / 2**20:.1f} MiB left); "
                             "capture fewer ops (capture=[patterns] or 'stats'), raise the memory budget "
                             "(WORKBENCH_CAPTURE_BUDGET) or pass spill_dir= on a larger disk")
        self._n += 1
        path = os.path.join(self._dir, f"{self._n:06d}.safetensors")
        try:
            mx.save_safetensors(path, {"value": value}, metadata={"op": name})
        except (OSError, RuntimeError) as e:
            try:
                os.remove(path)
            except OSError:
                pass
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpillError(f"full capture: spilling {name!r} to {self._dir} failed ({msg})") from None
        self._disk[name] = path
