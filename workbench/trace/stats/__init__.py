"""Cheap per-op statistics, evaluated in batches (never one synchronisation per op).

One interface, one backend per file:

* :mod:`.common` -- the dtype facts, the one finishing arithmetic (:func:`finish`), the rows
  it makes (:class:`Rows`, each dict built by :func:`workbench.stats_schema.row`);
* :mod:`.host` -- the CPU: zero-copy numpy views, reduced in a background thread;
* :mod:`.device` -- other GPUs (Metal): lazy MLX reductions in the same graph;
* :mod:`.cuda` -- a CUDA GPU: one custom kernel (``stats_kernel.cu``) per chunk of outputs;
* :mod:`.pending` -- the dispatch: :class:`Pending` (a batch being reduced), :func:`results`
  (many batches read together), :func:`evaluate` (at once).

Every backend reduces an output to min, max, sum and sum of squares (float64 sums) over its
finite elements that are not mask fill, and counts its zeros, mask fill, NaN, +Inf and -Inf
element by element; the statistics dict has the keys :data:`KEYS`, and an output with no
finite value has None for min, max, mean, std and absmax (the schema's one convention).
"""
from workbench.trace.stats.common import KEYS, Meta, Rows, dtype_max, empty_row, finish, jsonable, nonfinite_counts
from workbench.trace.stats.cuda import cuda_finish, cuda_parts, on_cuda
from workbench.trace.stats.pending import Pending, evaluate, results, use_host

__all__ = ["KEYS", "Meta", "Pending", "Rows", "cuda_finish", "cuda_parts", "dtype_max", "empty_row", "evaluate",
           "finish", "jsonable", "nonfinite_counts", "on_cuda", "results", "use_host"]
