"""Captured op outputs within a memory budget, spilling to safetensors on disk beyond it.

Values are kept in memory (as evaluated MLX arrays) until their total size passes the
budget; then the oldest ones are written, one ``.safetensors`` file each, into a
private temporary directory (or ``spill_dir``) and dropped from memory.  Reading a
spilled value loads it back (memory-mapped by MLX).  The directory is removed when the
store is garbage collected or :meth:`close`\\ d; nothing is written anywhere else.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections import OrderedDict

import mlx.core as mx

DEFAULT_BUDGET = int(os.environ.get("WORKBENCH_CAPTURE_BUDGET", 2 * 2**30))


class ValueStore:
    def __init__(self, budget: int | None = None, spill_dir: str | None = None):
        self.budget = DEFAULT_BUDGET if budget is None else int(budget)
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
                os.makedirs(self._spill_root, exist_ok=True)
            self._dir = tempfile.mkdtemp(prefix="workbench-trace-", dir=self._spill_root)
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._n += 1
        path = os.path.join(self._dir, f"{self._n:06d}.safetensors")
        mx.save_safetensors(path, {"value": value}, metadata={"op": name})
        self._disk[name] = path
