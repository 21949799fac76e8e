"""A reference model (mlx-lm or mlx-vlm), opened from a local checkpoint and traced at
module granularity.  (~500 lines, kept whole: the model and the Session recording its forward.)

    model = workbench.load("path/to/any-mlx-lm-checkpoint")          # no op program: module level
    model = workbench.load("path/to/llama", granularity="module")   # or asked for
    t = workbench.trace(model, "the cat sat")                          # a ModuleTrace

The reference builds the model from its own code (``mlx_lm.utils.load_model`` /
``mlx_vlm.utils.load_model``, lazily: weights stay memory-mapped until used);
:mod:`workbench.reference.recorder` makes every module call a step.  One instance per
compute dtype (the storage dtype first; others cast with ``Module.set_dtype``, as our
op programs cast float tensors), each instrumented once.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx
import mlx.nn as nn

from workbench import registry
from workbench.checkpoint import layouts, reference_arch, reference_config
from workbench.checkpoint import corrections
from workbench.dtypes import dtype_name, parse_dtype
from workbench.reference import recorder as R
from workbench.text import TextCodec
from workbench.trace.modules import ModuleTrace, tape_program
from workbench.trace import logits as _logits
from workbench.trace.entry import prepare_ids
from workbench.trace.step import TraceError


class Session:
    """Records one forward of a :class:`ReferenceModel` on fixed inputs (again, when
    interventions change) and recomputes single module calls."""

    def __init__(self, model: "ReferenceModel", ids: mx.array, dtype, kv_cache=None, extra=None, logit_rows=None):
        self.model = model
        self.ids = ids
        self.dtype = dtype
        self.kv_cache = kv_cache
        self.extra = dict(extra or {})
        #: the positions the head computes (workbench.trace.logits.LogitRows; None: every one)
        self.logit_rows = logit_rows
        self.feeds = {"input_ids": ids}
        self._cache0 = _snapshot(kv_cache)

    def record(self, interventions) -> R.Tape:
        module, paths = self.model.module(self.dtype)
        _restore(self.kv_cache, self._cache0)

        def op_for(name, mod):
            return _OpView(name, mod)

        tape = R.Tape(paths, [(iv, op_for) for iv in interventions], dtype=self.dtype, kv_cache=self.kv_cache)
        rows = self.logit_rows
        if rows is not None and not rows.all:
            tape.cut(rows, self.model.head_input(module), exact=rows.vocab is not None and
                     rows.batch * rows.T * rows.vocab <= _logits.exact_elements())
        with tape:
            self.model.forward(module, self.ids, self.kv_cache, self.extra)
        if not tape.names or tape.names[-1] != "logits":
            raise TraceError("the reference forward recorded no logits step (its root module did not "
                             "return an array)")
        if rows is not None and not rows.all:
            out = tape.outputs[-1]
            if out.ndim < 2 or out.shape[-2] != len(rows):
                raise TraceError(f"logits={rows.asked!r}: the {self.model.family} reference's head gave "
                                 f"{list(out.shape)}, not {len(rows)} positions: use logits='all' with this model")
        return tape

    def program(self, tape: R.Tape):
        """The op program of ``tape`` (:func:`workbench.trace.modules.tape_program`), the model's
        program for these module calls when it already made one."""
        return self.model.program_of(tape, lambda i: self.describe(tape, i))

    def describe(self, tape: R.Tape, i: int):
        mod = tape.modules[i]
        kind = R.original_class(mod).__name__
        base = tape.names[i].split("#")[0]
        params = () if base == "logits" else (base,)
        attrs: dict[str, Any] = {"path": self.model.raw_path(mod), "leaf": R.is_leaf(mod)}
        mode = getattr(mod, "mode", None)
        if isinstance(mode, str) and hasattr(mod, "bits"):
            attrs["quant"] = {"mode": mode, "bits": getattr(mod, "bits", None),
                              "group_size": getattr(mod, "group_size", None)}
        for k in ("n_heads", "num_heads", "num_attention_heads"):
            v = getattr(mod, k, None)
            if isinstance(v, int):
                attrs["num_heads"] = v
                break
        return kind, params, attrs

    def op_tensors(self, tape: R.Tape, name: str) -> dict[str, mx.array]:
        """The parameters of the step's module (a leaf's weight / scales / biases; for a
        container, everything under it), by step-style name."""
        i = tape.names.index(name)
        base = name.split("#")[0]
        if base == "logits":
            return {}
        return R.flat_parameters(tape.modules[i], base)

    def recompute(self, tape: R.Tape, i: int, dtype) -> mx.array:
        """Call module ``i`` again on its recorded inputs, in ``dtype`` (inputs cast, the
        module's parameters cast through the model instance of that dtype)."""
        args, kwargs = tape.args[i], tape.kwargs[i]
        for v in list(args) + list(kwargs.values()):
            if _is_cache(v):
                raise TraceError(f"{tape.names[i]!r} updates the KV cache: it is not recomputed "
                                 "(it would update the cache twice)")
        dtype = parse_dtype(dtype) or self.dtype
        module, _ = self.model.module(dtype)
        mod = R.module_at(module, self.model.raw_path(tape.modules[i]))

        def cast(v):
            if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype:
                return v.astype(dtype)
            return v
        out = mod(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        primary, _ = R.primary_array(out)
        if primary is None:
            raise TraceError(f"{tape.names[i]!r} returned no array when recomputed")
        return primary


class _OpView:
    """What an intervention function sees as ``op`` at module level."""

    def __init__(self, name, module):
        self.name = name
        self.kind = R.original_class(module).__name__
        self.attrs = {}
        for k in ("n_heads", "num_heads", "num_attention_heads"):
            v = getattr(module, k, None)
            if isinstance(v, int):
                self.attrs["num_heads"] = v
                break


def _is_cache(v) -> bool:
    if v is None or isinstance(v, (mx.array, int, float, str, bool)):
        return False
    if isinstance(v, (list, tuple)):
        return any(_is_cache(e) for e in v)
    return hasattr(v, "update_and_fetch") or hasattr(v, "offset")


def _appends_only(c) -> bool:
    """mlx-lm's plain ``KVCache``: it writes at and past its ``offset`` only (its buffers grow
    by concatenation, the positions below are never rewritten), so its state when a forward
    began is its offset then -- no copy of its buffers (a decoding loop's sessions would each
    hold one: memory quadratic in the tokens)."""
    t = type(c)
    return t.__name__ == "KVCache" and t.__module__ == "mlx_lm.models.cache"


def _snapshot(cache):
    if cache is None:
        return None
    items = cache if isinstance(cache, (list, tuple)) else [cache]
    return [(c, ("offset", c.offset, c.keys is None) if _appends_only(c) else
             {k: R.copy_array(v) if not isinstance(v, (list, dict)) else copy.copy(v) for k, v in vars(c).items()})
            for c in items]


def _restore(cache, snap) -> None:
    if snap is None:
        return
    for c, d in snap:
        if isinstance(d, tuple):  # an append-only cache: back to its offset then
            _, c.offset, fresh = d
            if fresh:
                c.keys = c.values = None
            continue
        vars(c).clear()
        vars(c).update({k: R.copy_array(v) if not isinstance(v, (list, dict)) else copy.copy(v) for k, v in d.items()})


class ReferenceModel(TextCodec):
    """A checkpoint opened by its reference implementation, traced module by module (what a
    trace needs of it: :class:`workbench.traceable.ModuleTraceable`)."""

    granularity = "module"

    def __init__(self, path, checkpoint, library: str, family: str):
        self.path = str(path)
        self.checkpoint = checkpoint
        self.library = library            # "mlx_lm" | "mlx_vlm"
        self.family = family              # the reference's module name (model_type after remapping)
        self.config = dict(checkpoint.text_config)
        self.full_config = dict(checkpoint.config)
        self._models: dict[Any, tuple[nn.Module, dict]] = {}
        self._raw_paths: dict[int, str] = {}
        #: (dtype, module call names) -> (the modules called, their op program): the last few recorded
        self._programs: dict[tuple, tuple[list, Any]] = {}
        # (what inspect refuses before building -- implausible numbers, a value of the wrong type
        #  for a field the reference reads -- is refused here alike: ConfigError naming it)
        reference_arch.check_config(checkpoint.config, library, family)
        #: the config normalised for the reference (raises ConfigError naming a key it would get wrong)
        self.read_config = reference_config.normalise(checkpoint.config, library, family)
        #: prompts longer than this would be computed wrongly by the reference (None: no bound)
        self.max_tokens = self.read_config.max_tokens
        self.tokenizer = checkpoint.tokenizer()  # (None: checkpoint.tokenizer_error says why)
        base, _ = self._load(None)
        self.dtype = _storage_dtype(base)
        self.default_dtype = self.dtype
        self._models[self.dtype] = (base, R.instrument(base))
        self._raw_paths.update(R.module_paths(base))
        self.num_layers = len(_layers(base))
        self.vocab_size = _vocab_size(self.config, self.full_config)

    def __repr__(self):
        return (f"<workbench model {self.family} ({self.library}, module granularity): {self.num_layers} layers, "
                f"{dtype_name(self.default_dtype)}>")

    # -- building
    def _load(self, dtype):
        root = Path(self.checkpoint.root)
        lib = "mlx-vlm" if self.library == "mlx_vlm" else "mlx-lm"
        try:
            if self.library == "mlx_vlm":
                model = self._load_vlm(root)
            else:
                from mlx_lm.utils import load_model as lm_load
                # (the config as the family reads it: checkpoint/reference_config.py; mlx-lm
                #  updates its own reading of config.json with it)
                model, _ = lm_load(root, lazy=True, strict=True, model_config=self.read_config.config,
                                   get_model_classes=self._lm_classes)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, FileNotFoundError) as e:
            msg = " ".join(str(e).split())[:400] or type(e).__name__
            raise ValueError(f"{root}: {lib}'s {self.family} model cannot be built from this checkpoint: {msg}") from None
        model.eval()
        if self.library == "mlx_lm":
            try:  # where mlx-lm computes other than the config and the original say
                corrections.correct(model, self.family, self.full_config)
            except corrections.ConfigError as e:
                raise ValueError(f"{root}: {e}") from None
        if dtype is not None:
            model.set_dtype(dtype)
        return model, None

    def _lm_classes(self, config):
        """mlx-lm's Model / ModelArgs of this family, its sanitize first reading the layouts
        transformers writes (checkpoint/layouts.py)."""
        mod = registry.import_reference("mlx_lm", self.family)
        return corrections.model_class(layouts.with_conversion(mod.Model, self.family), self.family), mod.ModelArgs

    def _load_vlm(self, root: Path) -> nn.Module:
        """mlx-vlm's model, built from config.json as mlx-vlm reads it
        (checkpoint/reference_config_vlm.py: transformers' key names and defaults made explicit)."""
        from mlx_vlm import utils as vlm_utils
        from workbench.checkpoint.reference_config_vlm import normalise_vlm, rename_weights

        read, sanitize = vlm_utils.load_config, vlm_utils.sanitize_weights

        def load_config(path, **kw):
            self.vlm_config = normalise_vlm(read(path, **kw), self.family)
            return copy.deepcopy(self.vlm_config)

        def sanitize_weights(obj, weights, config=None):  # (transformers 5's tensor names first)
            return sanitize(obj, rename_weights(weights, self.family) if config is None else weights, config)
        # (mlx-vlm's load_model reads config.json and renames tensors with no other way in)
        vlm_utils.load_config, vlm_utils.sanitize_weights = load_config, sanitize_weights
        try:
            return vlm_utils.load_model(root, lazy=True)
        finally:
            vlm_utils.load_config, vlm_utils.sanitize_weights = read, sanitize

    def module(self, dtype=None) -> tuple[nn.Module, dict]:
        """The instrumented reference model computing in ``dtype`` and its step names."""
        dt = parse_dtype(dtype) or self.default_dtype
        got = self._models.get(dt)
        if got is None:
            m, _ = self._load(dt)
            got = self._models[dt] = (m, R.instrument(m))
        return got

    def raw_path(self, module: nn.Module) -> str:
        p = self._raw_paths.get(id(module))
        if p is None:
            for m, _ in self._models.values():
                self._raw_paths.update(R.module_paths(m))
            p = self._raw_paths.get(id(module), "")
        return p

    def forward(self, module: nn.Module, ids: mx.array, cache=None, extra: Mapping | None = None):
        if self.library == "mlx_vlm":
            if self.family == "gemma3":  # (mlx-vlm's own call drops the causal and sliding masks with images)
                from workbench.reference import gemma3_vlm
                return gemma3_vlm.forward(module, ids, cache=cache, **dict(extra or {}))
            return module(ids, cache=cache, **dict(extra or {}))
        return module(ids, cache=cache)

    # -- running
    def make_cache(self):
        """The reference's own KV cache for this model."""
        module, _ = self.module()
        if hasattr(module, "make_cache"):
            return module.make_cache()
        from mlx_lm.models.cache import make_prompt_cache
        return make_prompt_cache(module)

    def __call__(self, ids, cache=None, dtype=None, **extra) -> mx.array:
        """Logits [B, T, vocab] of the reference forward (not recorded, lazy)."""
        module, _ = self.module(dtype)
        ids = mx.array(ids) if not isinstance(ids, mx.array) else ids
        self.check_length(ids.shape[-1], cache)
        self.check_dtype(dtype)
        out = self.forward(module, ids[None] if ids.ndim == 1 else ids, cache, extra)
        primary, _ = R.primary_array(out)
        return primary

    def trace(self, ids_or_text, capture="stats", dtype=None, **kw) -> ModuleTrace:
        """A :class:`ModuleTrace` of this model (``workbench.trace(model, ...)``, which checks
        what only an op program takes, e.g. ``attention=``)."""
        from workbench.trace.entry import trace
        return trace(self, ids_or_text, capture=capture, dtype=dtype, **kw)

    def module_trace(self, ids_or_text, capture="stats", dtype=None, breakpoints=None, interventions=None, *,
                     cache=None, attention_mask=None, pad_id=None, images=None, audio=None,
                     check_ids: bool = True, logits=None, **kw) -> ModuleTrace:
        """A :class:`ModuleTrace` of one forward (see :func:`workbench.trace.trace`); ``images``
        and ``audio`` (multimodal checkpoints) go through the model's own processor and
        their placeholder tokens go before the text (:mod:`workbench.reference.media`)."""
        ids, mask, batched = prepare_ids(self, ids_or_text, pad_id)
        extra = None
        if images or audio:
            if self.library != "mlx_vlm":
                raise TraceError("images and audio need the multimodal reference (mlx-vlm): this model was "
                                 f"opened with {self.library}")
            if ids.shape[0] != 1:
                raise TraceError("images and audio go with one prompt at a time")
            from workbench.reference import media
            ids, extra = media.prepare(self, ids[0].tolist(), images=images or (), audio=audio or ())
        if attention_mask is not None:
            mask = attention_mask if isinstance(attention_mask, mx.array) else mx.array(attention_mask)
        if mask is not None and not bool(mx.all(mask).item()):
            raise TraceError("a module-level trace runs the reference's own forward, which takes no padding "
                             "mask: trace sequences of equal length (or one at a time)")
        if check_ids and self.vocab_size is not None and ids.size:
            lo, hi = mx.stack([mx.min(ids), mx.max(ids)]).tolist()  # (one read back)
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"token id {hi if hi >= self.vocab_size else lo} out of range for a "
                                 f"vocabulary of {self.vocab_size}")
        self.check_length(ids.shape[-1], cache)
        self.check_dtype(dtype)
        dt = parse_dtype(dtype) or self.default_dtype
        rows = _logits.resolve(logits, ids.shape[-1], ids.shape[0], self.vocab_size, dt)
        if not rows.all and self.head_input(self.module(dt)[0]) is None:
            if rows.asked != "default":
                raise TraceError(f"logits={logits!r}: the {self.family} reference computes its head in the module "
                                 "that holds its layers, so no hidden state can be cut before it at module level: "
                                 "use logits='all' (or granularity='op' where an op program exists)")
            rows = _logits.LogitRows(range(rows.T), rows.T, "default", batch=rows.batch, vocab=rows.vocab)
        session = Session(self, ids, dt, cache, extra, logit_rows=rows)
        tr = ModuleTrace(session, capture=capture, breakpoints=breakpoints, interventions=interventions,
                         model=self, batched=batched, ids=ids, attention_mask=None, **kw)
        tr.logit_rows = rows
        return tr

    def head_input(self, module: nn.Module) -> nn.Module | None:
        """The module whose output the head reads (the decoder body: the parent of the layer
        list, e.g. mlx-lm's ``model``), where logits for some positions cut the hidden state;
        None when the layers sit in the root itself (the head is not separable there)."""
        found = _layer_list(module)
        if found is None:
            return None
        parent = found[0].rpartition(".")[0]
        return R.module_at(module, parent) if parent else None

    def check_dtype(self, dtype) -> None:
        """Refuse, before running, a compute dtype an MLX kernel this model calls cannot run on
        this device: unquantized mixture-of-experts layers (mlx-lm's ``SwitchLinear``) call
        ``gather_mm``, which MLX's CPU backend computes in float32 only."""
        dt = parse_dtype(dtype) or self.default_dtype
        if dt == mx.float32 or _gather_mm_runs(dt):
            return
        module, _ = self.module(self.default_dtype)
        if any(type(m).__name__ == "SwitchLinear" for _, m in module.named_modules()):
            raise TraceError(f"this model's unquantized experts run on MLX's gather_mm, which on this device "
                             f"({mx.default_device()}) computes in float32 only, not {dtype_name(dt)}: use "
                             "dtype='float32' (--dtype float32)")

    def check_length(self, n: int, cache=None) -> None:
        """Refuse a forward that would reach past :attr:`max_tokens` (a sliding window the
        reference never applies: reference_config.py)."""
        if self.max_tokens is None:
            return
        start = 0
        for c in (cache if isinstance(cache, (list, tuple)) else [cache] if cache is not None else []):
            start = max(start, int(getattr(c, "offset", 0) or 0))
        if start + n > self.max_tokens:
            raise TraceError(f"{self.read_config.why_max}; this forward reaches token {start + n} "
                             "(an op-level model applies the window, where one exists: granularity='op')")

    #: how many recorded structures keep their program (a prompt and decoding steps share one)
    PROGRAMS_KEPT = 8

    def program_of(self, tape: R.Tape, describe):
        """The op program of a recorded forward, made once per structure: the same module
        calls, in order, of the same module objects (a decoding loop records the same calls
        every token, so its traces share a program instead of describing every call again)."""
        key = (tape.dtype, tuple(tape.names))  # (each compute dtype calls a module tree of its own)
        hit = self._programs.get(key)
        # (a tape records a name and a module per call: equal names, equally many modules)
        if hit is not None and all(a is b for a, b in zip(hit[0], tape.modules)):
            return hit[1]
        program = tape_program(tape, describe)
        if len(self._programs) >= self.PROGRAMS_KEPT and key not in self._programs:
            self._programs.pop(next(iter(self._programs)))
        self._programs[key] = (list(tape.modules), program)
        return program

    # -- introspection
    def op_tensors(self, name: str) -> dict[str, mx.array]:
        module, paths = self.module()
        for m_id, n in paths.items():
            if n == name.split("#")[0]:
                mod = next(m for _, m in module.named_modules() if id(m) == m_id)
                return R.flat_parameters(mod, n)
        raise KeyError(f"no module named {name!r}")

    @property
    def step_names(self) -> list[str]:
        """Every module's step name (a forward may call some of them more than once)."""
        _, paths = self.module()
        return list(paths.values())


#: where references keep their decoder layers (after these, the longest list of modules outside the towers)
LAYER_LISTS = ("model.layers", "layers", "language_model.model.layers", "language_model.layers",
               "model.h", "transformer.h", "transformer.blocks", "backbone.layers")


def _layer_list(model: nn.Module) -> tuple[str, list] | None:
    """(path, modules) of the first of LAYER_LISTS that holds a non-empty list, or None."""
    for path in LAYER_LISTS:
        try:
            v = R.module_at(model, path)
        except (AttributeError, KeyError, IndexError, TypeError):
            continue
        if isinstance(v, (list, tuple)) and v:
            return path, list(v)
    return None


def _layers(model: nn.Module) -> list:
    found = _layer_list(model)
    if found is not None:
        return found[1]
    best: list = []
    for path, m in model.named_modules():
        if path.split(".")[0] in registry.TOWER_PREFIXES:
            continue
        for v in m.values():
            if isinstance(v, (list, tuple)) and len(v) > len(best) and all(isinstance(e, nn.Module) for e in v):
                best = list(v)
    return best


_GATHER_MM: dict = {}


def _gather_mm_runs(dtype) -> bool:
    """Whether ``mx.gather_mm`` runs in ``dtype`` on the default device (probed once)."""
    key = (str(mx.default_device()), dtype)
    if key not in _GATHER_MM:
        try:
            mx.eval(mx.gather_mm(mx.ones((1, 1, 2), dtype), mx.ones((2, 2, 2), dtype), rhs_indices=mx.array([1])))
            _GATHER_MM[key] = True
        except (RuntimeError, ValueError):
            _GATHER_MM[key] = False
    return _GATHER_MM[key]


def _storage_dtype(model: nn.Module):
    from mlx.utils import tree_flatten
    for _, v in tree_flatten(model.parameters()):
        if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating):
            return v.dtype
    return mx.float32


def _vocab_size(tc: Mapping, full: Mapping) -> int | None:
    for d in (tc, full):
        v = d.get("vocab_size")
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def open_reference(path, checkpoint=None, library: str | None = None) -> ReferenceModel:
    """Open a local checkpoint with the reference implementation that builds its model_type."""
    if checkpoint is None:
        from workbench.checkpoint import open_checkpoint
        checkpoint = open_checkpoint(path)
    if not Path(checkpoint.root).is_dir() or Path(path).is_file():
        raise ValueError(f"{path}: module-level tracing needs a checkpoint directory (config.json + safetensors)")
    lib, family = registry.reference_for(checkpoint.config, library)
    return ReferenceModel(path, checkpoint, lib, family)
