"""Property: the analyzer is sound for the emulator -- any plan edit that changes a single
bit of any op's output is reported as a hazard (and a clean report means bit-exact)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import workbench
import workbench.zoo
from workbench.buffers import Emulator, validate

IDS = [3, 17, 42, 5, 99, 7]


@pytest.fixture(scope="module", params=["llama", "gemma4_text"])
def emu(request, tmp_path_factory):
    model = workbench.load(workbench.zoo.build(request.param, tmp_path_factory.mktemp(request.param)))
    return Emulator(model, IDS)


edit = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(["like", "buffer"]),
                 st.integers(0, 3000))


@settings(max_examples=40, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(edit, min_size=1, max_size=3))
def test_any_corruption_is_reported(emu, edits):
    plan = emu.plan()
    names = list(plan.slots)
    ops = emu.program.names
    bufs = sorted(plan.buffers())
    for a, b, how, off in edits:
        name = ops[a % len(ops)]
        if how == "like":
            plan = plan.place(name, like=names[b % len(names)])
        else:
            plan = plan.place(name, bufs[b % len(bufs)], offset=off)
    run = emu.run(plan)
    validate(run.schedule.to_dict())
    if run.first_divergence() is not None or not run.exact:
        assert run.hazards, f"corrupted ({run.first_divergence()}) but no hazard: {edits}"
    if not run.hazards:
        assert run.exact and run.first_divergence() is None


@settings(max_examples=30, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(edit, max_size=2), skips=st.lists(st.integers(0, 10**6), max_size=3),
       barriers=st.sampled_from(["auto", "auto", "none", "all"]))
def test_any_corruption_is_reported_concurrent(emu, edits, skips, barriers):
    plan = emu.plan()
    names, ops, bufs = list(plan.slots), emu.program.names, sorted(plan.buffers())
    for a, b, how, off in edits:
        name = ops[a % len(ops)]
        plan = plan.place(name, like=names[b % len(names)]) if how == "like" else \
            plan.place(name, bufs[b % len(bufs)], offset=off)
    run = emu.run(plan, mode="concurrent", barriers=barriers, skip_barriers=[ops[k % len(ops)] for k in skips])
    validate(run.schedule.to_dict())
    if run.first_divergence() is not None or not run.exact:
        assert run.hazards, f"corrupted ({run.first_divergence()}) but no hazard"
    if not run.hazards:
        assert run.exact
