"""Buffer aliasing detection: the ``workbench.schedule/1`` format, the hazard analyzer,
the engine emulator, and a numpy ``out=`` aliasing checker.

Python API (see docs/schedule.md)::

    from workbench.buffers import load_schedule, analyze
    hazards = analyze(load_schedule("run.schedule.json"))   # -> list[Hazard]
    for h in hazards: print(h.kind, h.event, h.other, h.buffer, h.range, h.message)

    from workbench.buffers import Emulator
    emu = Emulator(model, ids)               # a workbench model and the token ids to run
    ok = emu.run()                           # default plan: hazard-free, logits bit-exact
    plan = emu.plan().place("layers.1.self_attn.o_proj", like="layers.1.self_attn.context")
    bad = emu.run(plan)                      # bad.logits corrupted, bad.hazards name the dispatch
    fixed = emu.run(plan.place("layers.1.self_attn.o_proj", buffer="attnH"))   # exact again

    from workbench.buffers import watch_numpy     # numpy out= kernels
    with watch_numpy() as found: np.matmul(x, w, out=x)
"""
from workbench.buffers.schedule import (FORMAT, Access, Event, Schedule, ScheduleError, load_schedule,  # noqa: F401
                                        parse, validate)
from workbench.buffers.analyze import KINDS, Hazard, analyze, summarize  # noqa: F401

from workbench.buffers.numpy_check import AliasError, OutAlias, check_out, no_alias, watch_numpy  # noqa: F401

__all__ = ["FORMAT", "KINDS", "Access", "Event", "Schedule", "ScheduleError", "Hazard", "analyze",
           "load_schedule", "parse", "validate", "summarize", "Emulator", "Plan", "Slot", "EmulatorRun",
           "AliasError", "OutAlias", "check_out", "no_alias", "watch_numpy"]


def __getattr__(name):  # the emulator pulls in MLX and the program executor: import it on first use
    if name in ("Emulator", "Plan", "Slot", "EmulatorRun", "role_of", "DEFAULT_INPLACE"):
        from workbench.buffers import emulator
        return getattr(emulator, name)
    raise AttributeError(f"module 'workbench.buffers' has no attribute {name!r}")
