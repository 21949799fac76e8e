"""Each family's knowledge of its checkpoints, one readable file per family whose names are
the checkpoint's: its model types, ``KEYS`` (every config key read, knowingly ignored, or
read at the values it implements; any other key or value is a ConfigError naming it, never a
default), ``read(text_config) -> Config`` (every form the references write) and
``tensors(cfg, arch)`` (the tensor table).

A family file imports only the reader's primitives (checkpoint/fields.py, common.py here)
and the model-type registry: checkpoint/arch.py reads a config with it, and the op program
(workbench/models/<family>.py, one floor up) builds from its Config.  gemma3n.py: a table
for inspect only (no op program).
"""
from __future__ import annotations

from workbench.checkpoint.families import gemma3_text, gemma3n, gemma4_text, llama, qwen3  # noqa: F401

#: our op families by name: each one's KEYS, read() -> Config and tensors()
FAMILIES = {m.FAMILY: m for m in (llama, qwen3, gemma3_text, gemma4_text)}
#: family -> its Keys
KEYS = {f: m.KEYS for f, m in FAMILIES.items()}

__all__ = ["FAMILIES", "KEYS"]
