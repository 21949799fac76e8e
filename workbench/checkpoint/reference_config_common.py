"""What every step of reading a reference config shares (reference_config.py, which re-exports
them, and reference_config_rope.py): the result (:class:`Normalised`), a value as a message
shows it (:func:`show`), config values compared as JSON reads them (:func:`equal`), a field set
from another form unless the config already says otherwise (:func:`set_field`), and
transformers' tagged floats read as floats (:func:`special_floats`)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping

from workbench.errors import ConfigError


@dataclass
class Normalised:
    """The config the reference reads, and what normalising it found."""
    config: dict
    filled: dict = field(default_factory=dict)      # field -> value taken from the original / rope_parameters
    consumed: set = field(default_factory=set)      # keys read into fields of another name
    max_tokens: int | None = None                   # prompts longer than this would be computed wrongly
    why_max: str = ""


def show(v) -> str:
    """A config value as a message shows it (JSON, cut at 60 characters)."""
    r = json.dumps(v) if isinstance(v, (dict, list, str, int, float, bool, type(None))) else repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def equal(a, b) -> bool:
    """Config values equal as JSON reads them (booleans are not numbers; floats to 1e-12)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


def set_field(cfg: dict, out: Normalised, key: str, value, source: str) -> None:
    """Set ``key`` from ``source``; refuse if the config already says something else."""
    if key in cfg and cfg[key] is not None:
        if not equal(cfg[key], value):
            raise ConfigError(f"config.json: {key} = {show(cfg[key])} and {source} = {show(value)} disagree")
        return
    cfg[key] = value
    out.filled[key] = value


#: how transformers writes a float JSON has no literal for (PreTrainedConfig._encode_special_floats:
#: Nemotron-H's time_step_limit [0.0, inf] is written [0.0, {"__float__": "Infinity"}])
_SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def special_floats(v):
    """``v`` with transformers' tagged floats ({"__float__": "Infinity"}) read as the floats they
    are, as transformers reads config.json."""
    if isinstance(v, dict):
        if set(v) == {"__float__"} and v["__float__"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[v["__float__"]]
        return {k: special_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [special_floats(x) for x in v]
    return v
