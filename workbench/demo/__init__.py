"""The embedded demo model: a small trained gemma4_text checkpoint in assets/.

* ``workbench.demo.paths``: ``DEMO``, ``DEMO_4BIT``, ``DEMO_MOE``, ``DEMO_EXPERTS``, ``DEMO_KV``
  (checkpoint directories; ``VARIANTS`` by name)
* ``workbench.demo.variants``: the experts and kv variants (notebooks 07, 08): training, studies
* ``workbench.demo.corpus``: the generated tasks (copy, recall) and the held-out set
* ``python -m workbench.demo.train``: the training script (see docs/demo.md)
* ``workbench demo [--eval] [--heads]``: the command line

Importing this package does not import mlx.
"""

#: attention heads of assets/demo with a clear pattern, as measured by
#: ``workbench demo --heads`` (workbench.demo.heads) on the held-out texts:
#: kind -> (layer, head, score).  Layers 0-2 are sliding-window (16 tokens), layer 3 full.
NAMED_HEADS = {
    "previous_token": (0, 1, 0.682),  # attends to the token just before
    "induction": (1, 0, 0.965),       # attends to the token after the current token's earlier occurrence
    "recall": (1, 0, 0.906),          # the same head, from an asked name to the colour after it
}
