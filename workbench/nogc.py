"""``no_gc()``: pause Python's cyclic garbage collector around code that makes many small,
acyclic objects it would otherwise rescan again and again (a trace's Step records and MLX
graph nodes, a parsed schedule's events).  Nothing allocated inside makes reference cycles
that must be collected meanwhile; the collector resumes (if it was on) on the way out."""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def no_gc():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
