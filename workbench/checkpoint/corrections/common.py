"""What every correction shares: a module given a subclass of its class (one, or every module of
a class), a positive number read."""
from __future__ import annotations

import mlx.nn as nn

from workbench.errors import ConfigError


def subclass(m: nn.Module, cache: dict, make_attrs) -> None:
    """Give module ``m`` a subclass of its class (same name, one per class and ``cache``)
    overriding the attributes ``make_attrs(base class)`` returns."""
    base = type(m)
    if base not in cache:
        cache[base] = type(base.__name__, (base,), {**make_attrs(base), "__module__": base.__module__,
                                                    "__qualname__": base.__qualname__})
    m.__class__ = cache[base]


def subclass_all(model: nn.Module, class_name: str, make_attrs, where=None) -> None:
    """:func:`subclass` on every module of ``model`` whose class is named ``class_name`` (and
    for which ``where(module)`` holds, where given), one subclass per class."""
    cache: dict = {}
    for _, m in model.named_modules():
        if type(m).__name__ == class_name and (where is None or where(m)):
            subclass(m, cache, make_attrs)


def number(args, name: str) -> float:
    """``args.name``, a positive number, or ConfigError naming it."""
    v = getattr(args, name, None)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ConfigError(f"config.json: {name} = {v!r} is not a positive number")
    return float(v)
