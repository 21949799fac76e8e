"""workbench: see inside transformer language models while they run (on MLX)."""
from workbench import _blas

_blas.ensure_fast_blas()  # must run before anything imports mlx.core

from workbench import traceable  # noqa: E402  (no mlx: what the floors above provide the models)


def _trace(model, *args, **kw):
    from workbench.trace.entry import trace

    return trace(model, *args, **kw)


def _open_reference(*args, **kw):
    from workbench.reference import open_reference

    return open_reference(*args, **kw)


# a model never imports the tracer or the reference (floors above it): ``model.trace(...)`` and
# ``load(granularity="module")`` reach them through these, registered before any module of the
# package runs (importing workbench.x runs this file first)
traceable.provide(trace=_trace, module_level=_open_reference)

__version__ = "0.1.0"


def blas_status() -> dict:
    """Which BLAS MLX uses on this machine (Linux CPU), and why."""
    return dict(_blas.STATUS)


def load(path, dtype=None, granularity="auto", library=None, attention="fused", memory_budget=None,
         progress=None):
    """Open a checkpoint as a runnable model (see workbench.models.load): our op program
    where one exists, else (or with granularity="module") the reference's own modules.
    attention: "fused" (default), "explicit" or the layers whose scores/softmax are steps.
    memory_budget: bytes or "8GB": stream the weights layer by layer within it."""
    from workbench.models import load as _load

    return _load(path, dtype=dtype, granularity=granularity, library=library, attention=attention,
                 memory_budget=memory_budget, progress=progress)


def inspect(path, values=False, **kw):
    """Check a checkpoint against its config (see workbench.checkpoint.inspect): returns a
    Report with ``.ok``, ``.problems`` and ``.to_dict()`` (the ``--json`` document)."""
    from workbench.checkpoint.inspect import inspect as _inspect

    return _inspect(path, values=values, **kw)


def __getattr__(name):
    # lazy: ``workbench.trace(model, ...)`` (the workbench.trace package is callable) and
    # ``workbench.generate(model, prompt, ...)``, without importing the tracer up front
    if name in ("trace", "generate"):
        import importlib

        mod = importlib.import_module("workbench.trace")
        return mod if name == "trace" else mod.generate
    if name == "crash_hunt":  # ``workbench.crash_hunt(path, prompt)``: the step that kills the process
        from workbench.trace.crash import crash_hunt

        return crash_hunt
    if name == "cache_check":  # ``workbench.cache_check(model, ids)``: cached decode vs one forward, per layer
        from workbench.trace.cache_check import cache_check

        return cache_check
    if name in ("diff", "plots"):  # ``workbench.diff.compare(...)``, ``workbench.plots.error_curve(...)``
        import importlib

        return importlib.import_module(f"workbench.{name}")
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
