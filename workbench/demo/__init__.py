"""The embedded demo model: a small trained gemma4_text checkpoint in assets/.

* ``workbench.demo.paths``: ``DEMO``, ``DEMO_4BIT``, ``DEMO_MOE`` (checkpoint directories)
* ``workbench.demo.corpus``: the generated tasks (copy, recall) and the held-out set
* ``python -m workbench.demo.train``: the training script (see docs/demo.md)
* ``workbench demo [--eval] [--heads]``: the command line

Importing this package does not import mlx.
"""
