"""One registry of model types: which of our op programs, and which reference
implementation (mlx-lm for text, mlx-vlm for multimodal), builds a checkpoint's model.

* ``OP_FAMILIES``: config model_type -> our op-program family (workbench/models/); the
  fine-grained default where it exists.
* the reference: mlx-lm builds ``mlx_lm.models.<type>`` (after its own remapping, e.g.
  mistral -> llama); mlx-vlm builds ``mlx_vlm.models.<type>``.  A checkpoint with
  vision or audio towers (``vision_config`` / ``audio_config``) goes to mlx-vlm, which
  is an optional extra (``pip install 'workbench[vlm]'``), imported only then.

Nothing here imports a reference package at module import time.
"""
from __future__ import annotations

import importlib.util
from typing import Mapping

#: config model_type (top level, or text_config's for wrappers) -> op-program family
#: (the MODEL_TYPES of workbench/models/; tests/test_inspect_reference.py checks they agree)
OP_FAMILIES = {
    "gemma4": "gemma4_text", "gemma4_text": "gemma4_text",
    "gemma3": "gemma3_text", "gemma3_text": "gemma3_text",
    "qwen3": "qwen3", "llama": "llama", "mistral": "llama", "qwen2": "llama",
}

#: config model_type -> family whose expected checkpoint tensors workbench/checkpoint/arch.py
#: writes out by hand: the op families, and Gemma 3n (mlx-lm reads its per-layer
#: intermediate sizes, mlx-vlm's model does not).  Every other model type's expected
#: tensors come from its reference model's parameters (checkpoint/reference_arch.py).
TABLE_FAMILIES = {**OP_FAMILIES, "gemma3n": "gemma3n", "gemma3n_text": "gemma3n"}

#: model types whose checkpoints carry towers when their config has these keys
TOWER_KEYS = ("vision_config", "audio_config")
#: top-level modules of the towers and their projectors (never the language model's layers)
TOWER_PREFIXES = ("vision_tower", "vision_model", "audio_tower", "embed_vision", "embed_audio",
                  "multi_modal_projector", "vision_embedder")

VLM_EXTRA = "pip install 'workbench[vlm]' (mlx-vlm)"


class MissingExtra(ImportError):
    """A reference package needed for this checkpoint is not installed (message names the extra)."""


def import_reference(library: str, name: str):
    """``{library}.models.{name}``, imported with its prints kept off stdout (a ``--json``
    answer stays JSON); a module that exits or fails to import (mlx-lm's olmo exits when
    ai2-olmo is missing) is a :class:`MissingExtra` naming the library, the architecture and
    what it printed or raised."""
    import contextlib
    import importlib
    import io

    out = io.StringIO()
    lib = library.replace("_", "-")
    try:
        with contextlib.redirect_stdout(out):
            return importlib.import_module(f"{library}.models.{name}")
    except SystemExit:
        said = " ".join(out.getvalue().split())[:200]
        raise MissingExtra(f"{lib}'s {name} exits when imported" + (f": {said}" if said else "")) from None
    except ImportError as e:
        raise MissingExtra(f"{lib}'s {name} cannot be imported: {' '.join(str(e).split())[:200]}") from None


def model_type(config: Mapping) -> str | None:
    mt = config.get("model_type")
    return mt if isinstance(mt, str) else None


def _family(config: Mapping, table: Mapping) -> str | None:
    mt = model_type(config)
    tc = config.get("text_config")
    if isinstance(tc, Mapping) and mt not in table and tc.get("model_type") in table:
        mt = tc.get("model_type")
    return table.get(mt) if isinstance(mt, str) else None


def op_family(config: Mapping) -> str | None:
    """Our op-program family for a config, or None."""
    return _family(config, OP_FAMILIES)


def table_family(config: Mapping) -> str | None:
    """The family of checkpoint/arch.py's hand-written tensor tables for a config, or None
    (then the reference model's parameters are the expected tensors)."""
    return _family(config, TABLE_FAMILIES)


def has_towers(config: Mapping) -> bool:
    return any(isinstance(config.get(k), Mapping) for k in TOWER_KEYS)


def _installed(pkg: str) -> bool:
    return importlib.util.find_spec(pkg) is not None


def lm_module(mt: str) -> str | None:
    """mlx-lm's module name for a model_type (its remapping applied), None if it has none."""
    return _lm_module(mt)


#: text-only model types mlx-lm builds through its multimodal wrapper's language model
#: (the config is wrapped as text_config, the names moved under language_model: checkpoint/
#: reference_config.py and layouts.py)
WRAPPED_TEXT = {"gemma3n_text": "gemma3n"}


def _lm_module(mt: str) -> str | None:
    if not _installed("mlx_lm"):
        return None
    from mlx_lm.utils import MODEL_REMAPPING
    name = MODEL_REMAPPING.get(mt, WRAPPED_TEXT.get(mt, mt))
    try:
        return name if importlib.util.find_spec(f"mlx_lm.models.{name}") is not None else None
    except (ImportError, ValueError):  # a model_type that is no module name ("kosmos-2.5")
        return None


def _vlm_module(mt: str) -> str | None:
    if not _installed("mlx_vlm"):
        return None
    try:
        from mlx_vlm.utils import MODEL_REMAPPING
    except ImportError:  # pragma: no cover - older mlx-vlm
        MODEL_REMAPPING = {}
    name = MODEL_REMAPPING.get(mt, mt)
    return name if importlib.util.find_spec(f"mlx_vlm.models.{name}") is not None else None


def reference_for(config: Mapping, library: str | None = None) -> tuple[str, str]:
    """("mlx_lm" | "mlx_vlm", module name) of the reference that builds this config.

    ``library`` forces one.  Raises :class:`MissingExtra` when only an uninstalled
    package could, ValueError when none can."""
    mt = model_type(config)
    if mt is None:
        raise ValueError("config.json has no string model_type: cannot tell which model to build")
    want_vlm = library == "mlx_vlm" or (library is None and has_towers(config))
    if want_vlm:
        name = _vlm_module(mt)
        if name is not None:
            return "mlx_vlm", name
        if not _installed("mlx_vlm"):
            if library == "mlx_vlm":
                raise MissingExtra(f"model_type {mt!r} with towers needs mlx-vlm: {VLM_EXTRA}")
        elif library == "mlx_vlm":
            raise ValueError(f"mlx-vlm cannot build model_type {mt!r}")
    name = _lm_module(mt)
    if name is not None:
        if want_vlm and not _installed("mlx_vlm"):
            raise MissingExtra(f"this {mt!r} checkpoint has vision/audio towers, which only mlx-vlm builds: "
                               f"{VLM_EXTRA} (its language model alone: library='mlx_lm')")
        return "mlx_lm", name
    raise ValueError(f"model_type {mt!r} is built neither by mlx-lm nor by mlx-vlm (nor by a workbench op "
                     f"program: {', '.join(sorted(OP_FAMILIES))})")


def known(config: Mapping) -> bool:
    """True when something here can build the config's model."""
    if op_family(config):
        return True
    try:
        reference_for(config)
        return True
    except (ValueError, ImportError):
        return False


def reference_available(config: Mapping) -> bool:
    """True when a reference implementation can build the config (towers included)."""
    try:
        reference_for(config)
        return True
    except (ValueError, ImportError):
        return False
