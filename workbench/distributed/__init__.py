"""Beyond one machine: a model split by layers across processes with MLX's own distributed
backend (``mx.distributed``, started with ``mlx.launch``), each rank stepping its layers,
rank 0 gathering every rank's per-op statistics in program order and the logits.

    # on every rank (mlx.launch --backend ring -n 2 -- python script.py):
    from workbench.distributed import trace_distributed
    t = trace_distributed("path/to/checkpoint", "The capital of France is")
    if t is not None:  # rank 0
        print(t.records()[:3], t.logits.shape)

plan.py (which rank runs which ops; what crosses each boundary), wire.py (bundles of named
arrays between ranks, gathering bytes), run.py (:func:`trace_distributed`), cli.py
(``workbench distributed``).  docs/distributed.md has the two-host recipe.
"""
from workbench.distributed.plan import Plan, balanced_split, make_plan
from workbench.distributed.run import DistributedTrace, trace_distributed
from workbench.distributed.wire import WireError

__all__ = ["trace_distributed", "DistributedTrace", "Plan", "make_plan", "balanced_split", "WireError"]
