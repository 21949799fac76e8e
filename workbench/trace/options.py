"""What :func:`workbench.trace` takes beside the prompt, grouped by concern.

``trace(model, ids_or_text, capture, dtype, breakpoints, interventions)`` says what runs and
what is seen of it (the values to capture, where to stop, what to change); three option
groups say the rest, each a frozen dataclass whose defaults are the trace's:

* :class:`Positions` -- which token positions: those the head computes (``logits``), the
  rows pruned (``prune``), a batch's padding (``pad_id``, ``attention_mask``);
* :class:`Run` -- how the forward runs: the attention form, the KV cache it continues,
  whether the ids are read back to check them;
* :class:`Storage` -- where captured values are kept: a memory budget, a spill directory,
  the size of a statistics batch, a shared store and its key prefix.

Each group may also be given as a dict of its fields (``run={"attention": "explicit"}``).
The old flat keywords (``trace(..., attention="explicit")``) still work for a release, with
one :class:`DeprecationWarning` per call naming the new spelling (:func:`resolve`).
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

#: the bytes of values waiting for evaluation at which a trace evaluates a statistics batch
FLUSH_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Positions:
    """Which token positions the forward computes and how a batch is padded.

    logits: the positions the head computes: ``"all"`` | ``"last"`` | a slice | a list of
        positions | None (``"all"`` unless [B, T, vocab] would pass the logits budget, then
        ``"last"``: :mod:`workbench.trace.logits`); ``tr.logit_positions`` says which it has.
    prune: True computes the layers whose rows reach no other position (Gemma 4's KV-shared
        layers) from the first logit position on only, as mlx-lm's chunked prefill does
        (``tr.positions(name)``, ``tr.pruned``); a model without such layers is refused.
    pad_id: the id a batch of unequal sequences is left padded with (None: the config's
        ``pad_token_id``, else 0).
    attention_mask: [B, T] (1 = a token, 0 = padding) instead of the one padding makes.
    """

    logits: Any = None
    prune: bool = False
    pad_id: int | None = None
    attention_mask: Any = None


@dataclass(frozen=True)
class Run:
    """How the forward runs.

    attention: None (the model's program, fused unless ``load`` said otherwise) |
        ``"fused"`` | ``"explicit"`` | layers (``3``, ``"layers.3"`` or a list) whose attention
        runs as explicit scores -> softmax -> context steps (docs/trace.md, Attention).
    cache: the KV cache the forward reads and extends (``model.make_cache()``; None: none).
    check_ids: False skips reading the ids back to check their range: for ids a sampler drew
        from this model's logits (a decoding step then queues without waiting for the device).
    """

    attention: Any = None
    cache: Any = None
    check_ids: bool = True


@dataclass(frozen=True)
class Storage:
    """Where captured values are kept.

    memory_budget: bytes of captured values kept in memory before spilling to disk (an int
        or a size like ``"2GB"``; None: a streamed model's ``capture_budget``, else the default).
    spill_dir: where values past the budget are written (None: a temporary directory).
    flush_bytes: evaluate the pending statistics once the values waiting pass this size.
    store: a :class:`~workbench.trace.store.ValueStore` shared with other traces (a
        generation's); its budget and directory then apply.
    key_prefix: what the values' keys in ``store`` start with (``"3/"``: forward 3's).
    """

    memory_budget: Any = None
    spill_dir: str | None = None
    flush_bytes: int = FLUSH_BYTES
    store: Any = None
    key_prefix: str = ""


#: keyword -> the group it belongs to, in the order trace() documents them
GROUPS = {"positions": Positions, "run": Run, "storage": Storage}
#: every old flat keyword -> its group's keyword
OLD_KEYWORDS = {f.name: key for key, cls in GROUPS.items() for f in fields(cls)}


def group(key: str, value) -> Any:
    """The option group ``key`` (``"positions"``, ``"run"``, ``"storage"``) from what was
    passed: None (the defaults), the group itself, or a dict of its fields."""
    cls = GROUPS[key]
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = {f.name for f in fields(cls)}
        bad = [k for k in value if k not in names]
        if bad:
            raise TypeError(f"{key}= has no option {', '.join(map(repr, bad))}: {cls.__name__} takes "
                            f"{', '.join(sorted(names))}")
        return cls(**value)
    raise TypeError(f"{key}= takes a {cls.__name__} (or a dict of its fields), not {type(value).__name__}")


def resolve(given: Mapping[str, Any], old: Mapping[str, Any], *, what: str = "trace()") -> dict[str, Any]:
    """The three groups by keyword, from the groups ``given`` and the old flat keywords
    ``old``: an unknown keyword is one TypeError naming it and the groups; old keywords
    warn once (one DeprecationWarning for the call, naming the new spelling) and may not be
    mixed with their own group."""
    unknown = [k for k in old if k not in OLD_KEYWORDS]
    if unknown:
        raise TypeError(f"{what} got unknown keyword argument{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))}: it takes capture, dtype, breakpoints, interventions, "
                        f"images, audio and the groups {', '.join(f'{k}={c.__name__}(...)' for k, c in GROUPS.items())}"
                        " (docs/trace.md, Options)")
    out = {k: group(k, given.get(k)) for k in GROUPS}
    if old:
        moved: dict[str, dict] = {}
        for k, v in old.items():
            moved.setdefault(OLD_KEYWORDS[k], {})[k] = v
        both = [k for k in moved if given.get(k) is not None]
        if both:
            raise TypeError(f"{what}: {', '.join(f'{n}=' for k in both for n in moved[k])} given beside "
                            f"{', '.join(f'{k}=' for k in both)}: pass them inside the group")
        spelled = ", ".join(f"{k}={GROUPS[k].__name__}({', '.join(f'{n}=...' for n in names)})"
                            for k, names in moved.items())
        warnings.warn(f"{what}: the keywords {', '.join(f'{n}=' for ns in moved.values() for n in ns)} are "
                      f"deprecated: pass {spelled} (from workbench.trace; docs/trace.md, Options)",
                      DeprecationWarning, stacklevel=_caller_level())
        for k, values in moved.items():
            out[k] = replace(out[k], **values)
    return out


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the package (the user's line, past
    ``model.trace`` and whatever else passes the call on), so that a notebook shows it."""
    f, level = sys._getframe(1), 1
    while f is not None and f.f_globals.get("__name__", "").partition(".")[0] == "workbench":
        f, level = f.f_back, level + 1
    return level


def flat(positions: Positions, run: Run, storage: Storage) -> dict[str, Any]:
    """Every option as the old flat keyword (what a module-level model's ``module_trace`` takes)."""
    return {f.name: getattr(g, f.name) for g in (positions, run, storage) for f in fields(g)}
