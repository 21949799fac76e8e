"""The benchmarks' one timing loop: variants run interleaved (one of each per round), so a
slow patch of a shared machine slows every variant alike and the ratios stay honest.

    from timing import CLOCKS, interleaved
    med = interleaved({"mlx-lm": f, "trace": g}, reps=7, clock=CLOCKS["wall"], warmup=2)
    med["trace"]  # (median seconds, min seconds)
"""
from __future__ import annotations

import argparse
import statistics
import time

#: --clock choices: wall (elapsed) or cpu (this process's CPU time, all threads)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def at_least(lo: int):
    """An argparse type: an integer >= ``lo`` (``--reps`` takes at_least(1): a median of no
    rounds is no figure), else the option's one-line usage error."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"{n} is below {lo}")
        return n
    return parse


def interleaved(variants: dict, reps: int, clock=time.perf_counter, warmup: int = 2) -> dict:
    """Run every variant ``warmup`` times (weights paged in, kernels compiled), then ``reps``
    rounds of one call each, in order; return name -> (median, min) seconds."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, not {reps}")
    for _ in range(warmup):
        for f in variants.values():
            f()
    times = {k: [] for k in variants}
    for _ in range(reps):
        for k, f in variants.items():
            t0 = clock()
            f()
            times[k].append(clock() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}
