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

import functools
import importlib.util
import re
from typing import Mapping

#: config model_type (top level, or text_config's for wrappers) -> op-program family: the one
#: list of model types (each family file's MODEL_TYPES is read from it: :func:`model_types`)
OP_FAMILIES = {
    "gemma4": "gemma4_text", "gemma4_text": "gemma4_text",
    "gemma3": "gemma3_text", "gemma3_text": "gemma3_text",
    "qwen3": "qwen3", "llama": "llama", "mistral": "llama", "qwen2": "llama",
}

#: config model_type -> family whose expected checkpoint tensors are written out by hand: the
#: op families (their files' ``tensors``), and Gemma 3n (checkpoint/arch.py: mlx-lm reads its
#: per-layer intermediate sizes, mlx-vlm's model does not).  Every other model type's expected
#: tensors come from its reference model's parameters (checkpoint/reference_arch.py).
TABLE_FAMILIES = {**OP_FAMILIES, "gemma3n": "gemma3n", "gemma3n_text": "gemma3n"}

#: model types whose checkpoints carry towers when their config has these keys
TOWER_KEYS = ("vision_config", "audio_config")
#: top-level modules of the towers and their projectors (never the language model's layers)
TOWER_PREFIXES = ("vision_tower", "vision_model", "audio_tower", "embed_vision", "embed_audio",
                  "multi_modal_projector", "vision_embedder")

VLM_EXTRA = "pip install 'workbench[vlm]' (mlx-vlm)"


def model_types(family: str) -> tuple[str, ...]:
    """The config model types our op-program ``family`` builds (from :data:`OP_FAMILIES`)."""
    types = tuple(t for t, f in OP_FAMILIES.items() if f == family)
    if not types:
        raise ValueError(f"no model type maps to op family {family!r} (OP_FAMILIES)")
    return types


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
    lib = library.replace("_", "-") if isinstance(library, str) else library
    if library not in LIBRARIES:
        raise ValueError(f"library {_shown(library)}: not one of {', '.join(LIBRARIES)}")
    if not is_module_name(name) or not defines_model(library, name):
        raise ValueError(f"{lib} has no model {_shown(name)} (a module of {library}.models defining "
                         f"{' and '.join(MODEL_NAMES[library])})")
    try:
        with contextlib.redirect_stdout(out):
            mod = importlib.import_module(f"{library}.models.{name}")
        if not all(hasattr(mod, n) for n in MODEL_NAMES[library]):
            raise ValueError(f"{lib}'s {name} defines no {' and '.join(MODEL_NAMES[library])}: not a model")
        return mod
    except SystemExit:
        said = " ".join(out.getvalue().split())[:200]
        raise MissingExtra(f"{lib}'s {name} exits when imported" + (f": {said}" if said else "")) from None
    except ImportError as e:
        raise MissingExtra(f"{lib}'s {name} cannot be imported: {' '.join(str(e).split())[:200]}") from None


#: the reference libraries, and the names a module of ``<library>.models`` defines for a model
LIBRARIES = ("mlx_lm", "mlx_vlm")
MODEL_NAMES = {"mlx_lm": ("Model", "ModelArgs"), "mlx_vlm": ("Model", "ModelConfig")}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _shown(x, limit: int = 60) -> str:
    """A value from a config for a one-line message: repr (control characters escaped), cut."""
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + f"... ({len(x) if isinstance(x, str) else len(r)} characters)"


def is_module_name(name) -> bool:
    """A plain ASCII identifier of at most 100 characters (no dot, no path, no dunder)."""
    return isinstance(name, str) and _IDENT.fullmatch(name) is not None and not name.startswith("__")


@functools.lru_cache(maxsize=512)
def defines_model(library: str, name: str) -> bool:
    """Whether ``{library}.models.{name}`` is an installed module that defines a model (binds
    MODEL_NAMES[library] at its top level, by a class or an import), read from its source
    without importing it: mlx-lm's helpers (``base``, ``cache``, ``mla``, ...) and mlx-vlm's
    processors are no models."""
    import ast

    if library not in LIBRARIES or not is_module_name(name):
        return False
    try:
        spec = importlib.util.find_spec(f"{library}.models.{name}")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        with open(spec.origin, "rb") as f:
            tree = ast.parse(f.read(4 << 20))
    except (OSError, SyntaxError, ValueError):
        return False
    bound = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            bound.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return all(n in bound for n in MODEL_NAMES[library])


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
    """The family of a hand-written tensor table for a config, or None
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


class Departs(ValueError):
    """The reference builds this model type under another name, but not as the original computes it."""


#: model types mlx-lm builds under another name (not in its MODEL_REMAPPING) -> (its module, why
#: workbench does not map them: where that module departs from transformers' model).  A model type
#: whose module computes what the original does would map (None as the reason).
ELSEWHERE: dict[str, tuple[str, str | None]] = {
    # (transformers' Ministral: Mistral with layer_types, the window on the sliding layers only, which
    #  mlx-lm's llama reads: 7.7e-7 of max |logit| vs torch, tests/data/archs/ministral)
    "ministral": ("llama", None),
    # (transformers' HunYuanMoEV1: mlx-lm's hunyuan, its routing corrected -- the top-k weights
    #  renormalised, the shared MLP always added, one expert a mixture too -- its fixed options and
    #  NTK-alpha RoPE filled by the reader: checkpoint/corrections/routing.py, tests/data/archs/hunyuan_v1_moe)
    "hunyuan_v1_moe": ("hunyuan", None),
}


def _lm_module(mt: str) -> str | None:
    if not _installed("mlx_lm"):
        return None
    from mlx_lm.utils import MODEL_REMAPPING
    if not isinstance(mt, str):
        return None
    name = MODEL_REMAPPING.get(mt, WRAPPED_TEXT.get(mt, mt))
    if mt in ELSEWHERE and not defines_model("mlx_lm", mt) and ELSEWHERE[mt][1] is None:
        name = ELSEWHERE[mt][0]
    # a plain identifier naming a module that defines a model, checked before any import
    # ("llama.os", "..", "base" or "cache" name no model)
    return name if is_module_name(name) and defines_model("mlx_lm", name) else None


def _remapped(mt: str) -> bool:
    """Whether a library's own remapping names ``mt`` ("phi-msft", "sam3.1_video"): its key
    need not be an identifier, the module it maps to is checked like any other."""
    for pkg in LIBRARIES:
        if _installed(pkg):
            try:
                remap = importlib.import_module(f"{pkg}.utils").MODEL_REMAPPING
            except (ImportError, AttributeError):  # pragma: no cover - older releases
                continue
            if mt in remap:
                return True
    return mt in WRAPPED_TEXT


def _vlm_module(mt: str) -> str | None:
    if not _installed("mlx_vlm"):
        return None
    try:
        from mlx_vlm.utils import MODEL_REMAPPING
    except ImportError:  # pragma: no cover - older mlx-vlm
        MODEL_REMAPPING = {}
    if not isinstance(mt, str):
        return None
    name = MODEL_REMAPPING.get(mt, mt)
    return name if is_module_name(name) and defines_model("mlx_vlm", name) else None


def reference_for(config: Mapping, library: str | None = None) -> tuple[str, str]:
    """("mlx_lm" | "mlx_vlm", module name) of the reference that builds this config.

    ``library`` forces one.  Raises :class:`MissingExtra` when only an uninstalled
    package could, ValueError when none can."""
    mt = model_type(config)
    if mt is None:
        raise ValueError("config.json has no string model_type: cannot tell which model to build")
    if library is not None and library not in LIBRARIES:
        raise ValueError(f"library {_shown(library)}: not one of {', '.join(LIBRARIES)}")
    if not is_module_name(mt) and not _remapped(mt):
        raise ValueError(f"config.json: model_type {_shown(mt)} is not a model name (a plain identifier: "
                         "letters, digits and underscores)")
    want_vlm = library == "mlx_vlm" or (library is None and has_towers(config))
    if want_vlm:
        name = _vlm_module(mt)
        if name is not None:
            return "mlx_vlm", name
        if not _installed("mlx_vlm"):
            if library == "mlx_vlm":
                raise MissingExtra(f"model_type {_shown(mt)} with towers needs mlx-vlm: {VLM_EXTRA}")
        elif library == "mlx_vlm":
            raise ValueError(f"mlx-vlm cannot build model_type {_shown(mt)}")
    name = _lm_module(mt)
    if name is None and mt in ELSEWHERE and ELSEWHERE[mt][1] is not None:
        raise Departs(f"model_type {_shown(mt)}: {ELSEWHERE[mt][1]}")
    if name is not None:
        if want_vlm and not _installed("mlx_vlm"):
            raise MissingExtra(f"this {_shown(mt)} checkpoint has vision/audio towers, which only mlx-vlm builds: "
                               f"{VLM_EXTRA} (its language model alone: library='mlx_lm')")
        return "mlx_lm", name
    raise ValueError(f"model_type {_shown(mt)} is built neither by mlx-lm nor by mlx-vlm (nor by a workbench op "
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
