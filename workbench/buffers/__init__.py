"""Buffer aliasing detection: the ``workbench.schedule/1`` format, the hazard analyzer,
the engine emulator, and a numpy ``out=`` aliasing checker.

Python API (see docs/schedule.md)::

    from workbench.buffers import load_schedule, analyze
    hazards = analyze(load_schedule("run.schedule.json"))   # -> list[Hazard]
    for h in hazards: print(h.kind, h.event, h.other, h.buffer, h.range, h.message)

    from workbench.buffers import Emulator
    emu = Emulator(model)                    # a workbench model (program + context + feeds)
    run = emu.run(ids)                       # default plan: hazard-free, exact logits
    plan = emu.plan().place("layers.0.self_attn.o_proj", like="layers.0.self_attn.sdpa")
    bad = emu.run(ids, plan)                 # bad.logits corrupted, bad.hazards name the dispatch
"""
from workbench.buffers.schedule import (FORMAT, Access, Event, Schedule, ScheduleError, load_schedule,  # noqa: F401
                                        parse, validate)
from workbench.buffers.analyze import KINDS, Hazard, analyze, summarize  # noqa: F401

__all__ = ["FORMAT", "KINDS", "Access", "Event", "Schedule", "ScheduleError", "Hazard", "analyze",
           "load_schedule", "parse", "validate", "summarize"]
