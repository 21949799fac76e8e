"""Architecture knowledge: what a config.json means, and the tensors a sound checkpoint holds.

Reading a config (:func:`build_arch`) is the same for ``inspect`` and ``workbench.load``.
For our op families each family's file in checkpoint/families/ holds what the family knows
of its checkpoints, once: its model types, its ``KEYS`` (every key read, knowingly ignored,
or read at the values it implements; any other key or value is a :class:`ConfigError`
naming it, never a default), ``read(text_config) -> Config`` (every form the references
write: transformers >= 5 ``rope_parameters``, per layer type for Gemma 3 / 4, Gemma 4's
``per_layer_config``, the older flat keys) and ``tensors(cfg, arch)`` (the expected
tensors); the op program built from that Config is workbench/models/<family>.py, a floor
up.  Here: the wrapper around a text config (multimodal checkpoints, with or without a
top-level ``vocab_size``), the choice of family, and the reference model's parameters for
every other type (reference_arch.py).

The result, :class:`Arch`, carries ``spec``: the family's Config (what its op program is
built from), and ``expected``: every language-model tensor with its float shape
(quantization is applied on top, see quant.py).  The rules every family reads with are in
fields.py.
"""
from __future__ import annotations

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.families import FAMILIES as FAMILY_FILES, KEYS, gemma3n  # noqa: F401  (KEYS re-exported)
from workbench.checkpoint.fields import Arch, ConfigError, Expected, Keys, ROPE_TYPES, read_rope  # noqa: F401
from workbench.checkpoint.reference_config import COMMON_IGNORED  # noqa: F401  (re-exported)

#: config model_type -> family of a hand-written table (one registry: workbench.registry);
#: any other type's expected tensors come from its reference model (reference_arch.py)
FAMILIES = registry.TABLE_FAMILIES
#: families whose RMSNorm computes x * (1 + w): their neutral norm weight is 0
ZERO_CENTRED_NORMS = {"gemma3_text"}


def text_config(config: dict) -> dict:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def family_of(config: dict) -> str | None:
    return registry.table_family(config)


def _from_reference(config: dict) -> Arch:
    """Expected tensors of a model type with no table here: the reference model's own
    parameters (reference_arch.py)."""
    from workbench.checkpoint import reference_arch as R

    r = R.reference_tensors(config)  # (ConfigError naming what the reference cannot build)
    tc = text_config(config)
    lt = tc.get("layer_types")
    a = Arch(r.family, dict(tc), r.num_layers, layer_types=list(lt) if isinstance(lt, list) else [], tied=r.tied,
             moe=r.moe)
    for t in r.tensors.values():
        a.add(t.name, t.shape, t.kind, t.layer, optional=t.optional, ignored_if_present=t.ignored_if_present)
    return a

#: keys a multimodal wrapper (the config around text_config) may hold that the text model reads
WRAPPER_HANDLED = frozenset({"model_type", "text_config", "vocab_size", "tie_word_embeddings",
                             "quantization", "quantization_config"})


def build_arch(config: dict) -> Arch:
    """Read a config.json dict: the family's Config (``spec``) and expected tensors. Raises
    ConfigError (bad-config) naming the key."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    fam = family_of(config)
    if not isinstance(config.get("model_type"), str):
        raise ConfigError("config.json: required field 'model_type' is missing or not a string")
    if fam is None:
        return _from_reference(config)
    tc = dict(text_config(config))
    if isinstance(config.get("text_config"), dict):
        # multimodal wrappers: the top-level vocab_size (mlx-lm) or the text config's (transformers,
        # which writes none at the top), else mlx-lm's wrapper default; head counts a Hugging Face
        # config omits take the wrapper's defaults (mlx-lm gemma3.py / gemma4.py)
        top, inner = config.get("vocab_size"), tc.get("vocab_size")
        if top is not None and inner is not None and top != inner:
            raise ConfigError(f"config.json: vocab_size = {F.show(top)} and text_config.vocab_size = {F.show(inner)} "
                              "disagree")
        mt = config.get("model_type")
        default_vocab = {"gemma3": 262208, "gemma4": 262144}.get(mt)
        vocab = top if top is not None else inner if inner is not None else default_vocab
        if vocab is not None:
            tc["vocab_size"] = vocab
        if mt == "gemma3":
            tc.setdefault("num_attention_heads", 8)
            tc.setdefault("num_key_value_heads", 4)
        elif mt == "gemma4":
            tc.setdefault("num_attention_heads", 8)
            tc.setdefault("num_key_value_heads", 1)
        tie_top, tie_in = config.get("tie_word_embeddings"), tc.get("tie_word_embeddings")
        if tie_top is not None and tie_in is not None and tie_top != tie_in:
            raise ConfigError(f"config.json: tie_word_embeddings = {F.show(tie_top)} and "
                              f"text_config.tie_word_embeddings = {F.show(tie_in)} disagree")
        if tie_in is None and tie_top is not None:
            tc["tie_word_embeddings"] = tie_top
    if fam == gemma3n.FAMILY:
        return gemma3n.arch(tc)
    mod = FAMILY_FILES[fam]
    F.check_keys(tc, fam, mod.KEYS)
    cfg = mod.read(tc)
    a = Arch(fam, tc, cfg.num_hidden_layers, layer_types=list(cfg.layer_types), tied=cfg.tie_word_embeddings,
             neutral_norm=0.0 if fam in ZERO_CENTRED_NORMS else 1.0, spec=cfg)
    mod.tensors(cfg, a)
    return a
