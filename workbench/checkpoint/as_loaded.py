"""What ``workbench.load`` would refuse where it opens a checkpoint at module level.

``inspect`` vouches only for what ``workbench.load`` opens at the granularity it picks by
itself ("auto").  For an op family that is our op program, whose checks are inspect's own.
Otherwise load opens the reference's modules, which raises on what inspect's table may not
read: :func:`check_as_loaded` covers that ground, on placeholders (broadcast zeros of the
stored shapes and dtypes, nothing real-size allocated):

* a family with a table but no op program (Gemma 3n): the reference's model is built from
  the config as loading builds it, and a config it cannot build from is a ``bad-config``
  error (families with no table were built so already, checks.py);
* where load opens the checkpoint with mlx-vlm (the config names towers), the towers and
  projectors, which mlx-vlm loads strictly: every stored tensor through mlx-vlm's
  ``sanitize`` (the model's, then its towers', in its ``load_model``'s order), then names and
  shapes against the model's tower parameters.  A tower tensor missing, left over or
  mis-shaped is an error, named by the tensor.
"""
from __future__ import annotations

from workbench import registry
from workbench.checkpoint import names as N
from workbench.errors import ConfigError

#: problems of one kind listed one by one; past this, one line counts the rest
LISTED = 20


def module_pick(config) -> tuple[str, str] | None:
    """(library, module name) when ``workbench.load`` (granularity "auto") opens this config
    with a reference at module level, None for an op program; ValueError (or MissingExtra)
    when no reference builds it."""
    if registry.op_family(config) is not None:
        return None
    return registry.reference_for(config)


def _tower(name: str) -> bool:
    return N.split_name(name)[0] != "language_model"


def check_as_loaded(cx) -> None:
    """Add an error for what loading at module level would refuse (``cx``: checks.Context)."""
    ck = cx.ck
    if not ck.config_present or ck.arch is None:
        return
    try:
        pick = module_pick(ck.config)
    except (ValueError, ImportError) as e:  # (a table read it -- e.g. by text_config's model_type -- load cannot)
        cx.add("bad-config", "error", f"{e}: workbench.load cannot open it", file="config.json")
        return
    if pick is None:
        return
    lib, family = pick
    if lib != "mlx_vlm" and registry.table_family(ck.config) is None:
        return  # (the expected tensors came from this very model: built already)
    from workbench.checkpoint.reference_arch import build_model
    from workbench.checkpoint.reference_config_vlm import normalise_vlm

    who = f"{lib.replace('_', '-')}'s {family}"
    try:
        cfg = normalise_vlm(ck.config, family) if lib == "mlx_vlm" else ck.config
        _, _, model = build_model(cfg, lib)
    except ConfigError as e:
        cx.add("bad-config", "error", f"{e}; workbench.load opens this checkpoint with {who}", file="config.json")
        return
    if lib == "mlx_vlm":
        _check_towers(cx, model, family, who)


def _check_towers(cx, model, family: str, who: str) -> None:
    from mlx.utils import tree_flatten

    from workbench.checkpoint.reference_config_vlm import rename_weights
    from workbench.checkpoint.sanitize_layout import placeholder

    ck = cx.ck
    hint = (" (library='mlx_lm' opens its language model alone)"
            if registry.lm_module(registry.model_type(ck.config) or "") else "")
    ph = {n: placeholder(ti.shape, ti.dtype) for n, ti in ck.tensors.items()}
    stored_of = {id(v): n for n, v in ph.items()}
    try:
        w = _sanitized(model, rename_weights(dict(ph), family), family)
    except KeyError as e:
        need = str(e.args[0]) if e.args else "?"
        cx.add("missing-tensor", "error", f"{need} is missing: {who}'s sanitize needs it to load the towers, so "
               f"workbench.load refuses this checkpoint{hint}", tensor=need, layer=None)
        return
    except Exception as e:  # noqa: BLE001 - a sanitize that cannot take these towers: loading fails the same way
        msg = " ".join(str(e).split())[:160]
        cx.add("bad-config", "error", f"{who}'s sanitize cannot read this checkpoint's towers ({type(e).__name__}"
               f"{': ' + msg if msg else ''}), so workbench.load refuses it{hint}", file="config.json")
        return
    params = {n: v for n, v in tree_flatten(model.parameters()) if _tower(n)}
    quantized = {n[: -len(".scales")] for n in w if n.endswith(".scales")}
    missing = [n for n in params if n not in w]
    extra = [n for n in w if _tower(n) and n not in params
             and not (n.endswith((".scales", ".biases")) and n.rsplit(".", 1)[0] in quantized)]
    shapes = [n for n, v in params.items() if n in w and n.rsplit(".", 1)[0] not in quantized
              and tuple(w[n].shape) != tuple(v.shape)]
    for n in missing[:LISTED]:
        cx.add("missing-tensor", "error", f"{n} ({list(params[n].shape)}) is missing: {who} has it and loads "
               f"strictly{hint}", tensor=n, layer=None)
    for n in extra[:LISTED]:
        src = stored_of.get(id(w[n]), n)
        cx.add("unexpected-tensor", "error", f"{src} is not a parameter of {who}, which loads strictly",
               tensor=src, layer=None)
    for n in shapes[:LISTED]:
        src = stored_of.get(id(w[n]), n)
        cx.add("shape-mismatch", "error", f"{src} has shape {list(w[n].shape)} as {who} reads it, expected "
               f"{list(params[n].shape)}", tensor=src, layer=None)
    for what, names in (("missing", missing), ("unexpected", extra), ("mis-shaped", shapes)):
        if len(names) > LISTED:
            cx.add({"missing": "missing-tensor", "unexpected": "unexpected-tensor"}.get(what, "shape-mismatch"),
                   "error", f"and {len(names) - LISTED} more tower tensors {what} for {who}", layer=None)


def _sanitized(model, weights: dict, family: str) -> dict:
    """``weights`` through mlx-vlm's sanitize steps, in the order its ``load_model`` runs them."""
    from mlx_vlm.utils import sanitize_weights

    from workbench.checkpoint.reference_arch import no_allocation

    mod = registry.import_reference("mlx_vlm", family)
    mc = model.config
    with no_allocation():
        weights = sanitize_weights(model, weights)
        for cls, attr in (("VisionModel", "vision_config"), ("LanguageModel", "text_config"),
                          ("AudioModel", "audio_config")):
            if hasattr(mod, cls) and hasattr(mc, attr):
                weights = sanitize_weights(getattr(mod, cls), weights, getattr(mc, attr))
    return weights
