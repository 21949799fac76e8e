"""Models larger than memory: ``workbench.load(path, memory_budget="8GB")``.

A streamed model holds no weights between runs.  Its program runs in *segments*, the
maximal runs of ops with the same ``op.layer`` (the embedding, each layer, the final norm
and head): an op reads its tensors from the checkpoint when it runs (lazily, through the
reader: :meth:`Checkpoint.load` with ``keep=False``); at the end of each segment the
trace evaluates every live value (and the KV cache) and calls
:meth:`StreamedModel.release_weights`, which drops every tensor read so far and returns
MLX's freed buffers to the system (``mx.clear_cache``).  Quantized weights stay packed
(only floating tensors are converted to the compute dtype, as always).

Nothing stays resident: tables used in more than one place (a tied ``embed_tokens``
read again as the head, Gemma 4's per-layer input tables) are read again by each
segment that uses them.  So the weights in memory at any time are one segment's, and
the peak is the largest segment (:attr:`StreamedModel.largest_segment`) plus the
activations; ``load`` refuses a budget below the largest segment, naming it.  What is
left of the budget holds captured values (``capture="full"``); the rest spills to disk
(:class:`workbench.trace.store.ValueStore`).

Everything that runs the program streams: ``model(ids)`` (evaluated, not lazy: it runs
a trace without capture), ``model.trace(...)``, stepping, going back, the hunt's
recomputation and ``workbench.generate`` (each forward re-reads the weights: streaming
trades time for memory).  Running ``workbench.program.execute`` on its program directly
does not stream (nothing evaluates at segment ends): the weights it reads stay until the
next release.  A progress bar (:mod:`workbench.progress`) follows the
segments when a run is slow, in a terminal or a notebook (``load(progress=...)``).
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Iterable, Mapping

import mlx.core as mx

from workbench.dtypes import dtype_name, parse_dtype
from workbench.models.model import Model
from workbench.sizes import fmt_bytes


class StreamingTensors(Mapping):
    """Checkpoint tensors read on use and kept only until :meth:`release`."""

    def __init__(self, ck, names: Iterable[str]):
        self.ck = ck
        self.names = list(names)
        self._set = set(self.names)
        self._live: dict[str, mx.array] = {}

    def __getitem__(self, name):
        v = self._live.get(name)
        if v is None:
            if name not in self._set:
                raise KeyError(name)
            v = self._live[name] = self.ck.load(name, keep=False)
        return v

    def release(self) -> None:
        self._live.clear()

    @property
    def loaded(self) -> list[str]:
        """The tensors read since the last release."""
        return list(self._live)

    def __contains__(self, name):
        return name in self._set

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


@dataclass(frozen=True)
class Segment:
    """A maximal run of ops of one layer (None: outside the layers) and the bytes of the
    checkpoint tensors they read, as held while it runs (stored and converted)."""

    layer: int | None
    first: str   # first op's name
    last: str    # last op's name
    nbytes: int

    @property
    def label(self) -> str:
        return f"layers.{self.layer}" if self.layer is not None else f"{self.first}..{self.last}"


def segments(model: Model, program=None, dtype=None) -> list[Segment]:
    """The program's segments with the weight bytes each holds in compute dtype ``dtype``
    (default the model's): a tensor read in the storage dtype and, when floating and of
    another dtype, its converted copy too; a half of a fused tensor reads the whole."""
    program = program or model.program
    dt = parse_dtype(dtype) or model.default_dtype
    ck = model.checkpoint
    out: list[Segment] = []
    ops = program.ops
    start = 0
    for i, op in enumerate(ops):
        if i + 1 < len(ops) and ops[i + 1].layer == op.layer:
            continue
        names = {n for o in ops[start:i + 1] for n in model.op_tensor_names(o)}
        total = 0
        for n in names:
            t = ck.info(n)
            total += ck.info(t.source_name).nbytes if t.part else t.nbytes
            stored = _FLOAT.get(t.dtype)
            if stored is not None and stored != dt:  # Weights keeps a converted copy beside it
                total += t.nbytes // stored.size * dt.size
        out.append(Segment(op.layer, ops[start].name, op.name, total))
        start = i + 1
    return out


_FLOAT = {"F16": mx.float16, "BF16": mx.bfloat16, "F32": mx.float32, "F64": mx.float64}


def _libc():
    try:
        lib = ctypes.CDLL(None)
        return lib if hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def _trim_heap() -> None:
    """glibc keeps freed blocks below its (adaptive, up to 32 MiB) mmap threshold in the
    heap: a released layer's smaller matrices would stay in the process's memory.
    ``malloc_trim(0)`` hands the free pages back (a no-op elsewhere)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class StreamedModel(Model):
    """A :class:`Model` whose weights are read per segment and released after (module
    docstring).  ``memory_budget``: bytes for weights and captured values together."""

    def __init__(self, family, config, text_config, checkpoint, program, tensor_names, *,
                 memory_budget: int, progress=None, **kw):
        self._stream = StreamingTensors(checkpoint, tensor_names)
        self._converted: dict = {}
        self._checked: set = set()  # compute dtypes whose weights were checked against the budget
        super().__init__(family, config, text_config, checkpoint, program, tensor_names,
                         tensors=self._stream, **kw)
        self._stream.release()  # (the storage dtype was read from a tensor's header: lazy, never evaluated)
        self.memory_budget = int(memory_budget)
        #: None: a progress bar when a run is slow and stderr is a terminal or in a notebook;
        #: True / False: always / never (workbench.progress)
        self.progress = progress
        self.check_budget()

    def __repr__(self):
        return super().__repr__()[:-1] + f", streamed within {fmt_bytes(self.memory_budget)}>"

    def check_budget(self, program=None, dtype=None) -> Segment:
        """The largest segment; a ValueError naming it when it does not fit the budget."""
        seg = max(segments(self, program, dtype), key=lambda s: s.nbytes)
        if seg.nbytes > self.memory_budget:
            raise ValueError(f"memory_budget {self.memory_budget} bytes ({fmt_bytes(self.memory_budget)}) is "
                             f"below the weights of {seg.label} ({seg.nbytes} bytes, {fmt_bytes(seg.nbytes)}, read "
                             f"whole while it runs, in {dtype_name(parse_dtype(dtype) or self.default_dtype)}): "
                             "raise the budget or compute in the storage dtype")
        return seg

    def context(self, dtype=None, cache=None):
        """As :meth:`Model.context`; a compute dtype whose converted weights would not fit
        the budget is refused (ValueError naming the segment)."""
        dt = parse_dtype(dtype) or self.default_dtype
        if dt not in self._checked:
            self.check_budget(dtype=dt)
            self._checked.add(dt)
        return super().context(dtype, cache)

    @property
    def largest_segment(self) -> Segment:
        return self.check_budget()

    @property
    def capture_budget(self) -> int:
        """What the budget leaves for captured values beside the largest segment's weights."""
        return max(self.memory_budget - self.largest_segment.nbytes, 0)

    @property
    def loaded(self) -> list[str]:
        """The checkpoint tensors read since the last release (segment end)."""
        return self._stream.loaded

    def weights(self, dtype=None):
        w = super().weights(dtype)
        self._converted[w.dtype] = w
        return w

    def release_weights(self) -> None:
        """Drop every tensor read so far (the trace calls this at each segment's end, once
        the live values are evaluated) and give MLX's freed buffers back to the system."""
        for w in self._converted.values():
            w.release()
        self._stream.release()
        mx.clear_cache()
        _trim_heap()

    def __call__(self, ids, attention_mask=None, cache=None, dtype=None) -> mx.array:
        """Logits [B, T, vocab], evaluated (the program runs segment by segment)."""
        t = self.trace(ids, capture=None, dtype=dtype, cache=cache, attention_mask=attention_mask)
        t.run()
        return t.value(t.ops[-1])
