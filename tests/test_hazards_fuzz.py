"""Fuzzing the schedule reader, analyzer and `hazards` CLI: any input gives hazards or a
ScheduleError / exit 2 naming where it is wrong; never a traceback, never a hang."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings, strategies as st

from workbench.buffers import KINDS, ScheduleError, analyze, parse
from workbench.cli import main as cli_main

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_any = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), c, max_size=4)),
                        max_leaves=20)

BUFS = ["a", "b", "c"]
nbytes = st.one_of(st.integers(min_value=0, max_value=64), st.integers(min_value=0, max_value=2**62),
                   st.integers(min_value=-3, max_value=-1), st.just(True), st.just(1.5), st.just("8"))
access = st.fixed_dictionaries(
    {"buffer": st.sampled_from(BUFS + ["zz", ""]), "offset": nbytes, "size": nbytes},
    optional={"arg": st.sampled_from(["x", "y", "out", ""]), "value": st.sampled_from(["v", "w", None, 3]),
              "offest": st.just(0), "x-note": json_any})
dispatch = st.fixed_dictionaries(
    {"type": st.just("dispatch"), "name": st.sampled_from(["q_proj", "o_proj", "add", ""])},
    optional={"kernel": st.sampled_from(["k", "add", 7]), "cb": st.one_of(st.integers(0, 3), st.just("cb")),
              "reads": st.lists(access, max_size=3), "writes": st.lists(access, max_size=2)})
other_event = st.one_of(
    st.just({"type": "barrier"}),
    st.fixed_dictionaries({"type": st.sampled_from(["alloc", "free"]), "buffer": st.sampled_from(BUFS + ["new"])},
                          optional={"size": nbytes, "initialized": st.sampled_from([True, False, 1])}),
    st.fixed_dictionaries({"type": st.sampled_from(["commit", "complete"])}, optional={"cb": st.integers(0, 3)}),
    json_any)
schedule_like = st.fixed_dictionaries(
    {"format": st.sampled_from(["workbench.schedule/1", "workbench.schedule/1", "workbench.schedule/2"]),
     "mode": st.sampled_from(["serial", "concurrent", "serial", "both"]),
     "events": st.lists(st.one_of(dispatch, dispatch, other_event), max_size=25)},
    optional={"buffers": st.dictionaries(st.sampled_from(BUFS), st.fixed_dictionaries(
        {"size": nbytes}, optional={"initialized": st.sampled_from([True, False, "yes"])}), max_size=3),
        "kernels": st.dictionaries(st.sampled_from(["k", "add"]), st.fixed_dictionaries(
            {"inplace": st.lists(st.one_of(st.lists(st.sampled_from(["x", "y", "out"]), min_size=2, max_size=2),
                                           json_any), max_size=2)})),
        "junk": json_any})

ok_access = st.fixed_dictionaries(
    {"buffer": st.sampled_from(BUFS), "offset": st.integers(0, 64), "size": st.integers(0, 32)},
    optional={"arg": st.sampled_from(["x", "y", "out"]), "value": st.sampled_from(["v", "w"])})
ok_event = st.one_of(
    st.fixed_dictionaries({"type": st.just("dispatch"), "name": st.sampled_from(["q_proj", "o_proj", "add"]),
                           "reads": st.lists(ok_access, max_size=3), "writes": st.lists(ok_access, max_size=2)},
                          optional={"kernel": st.sampled_from(["k", "add"]), "cb": st.integers(0, 3)}),
    st.just({"type": "barrier"}),
    st.fixed_dictionaries({"type": st.just("alloc"), "buffer": st.sampled_from(BUFS), "size": st.integers(0, 64)},
                          optional={"initialized": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("free"), "buffer": st.sampled_from(BUFS)}),
    st.fixed_dictionaries({"type": st.sampled_from(["commit", "complete"]), "cb": st.integers(0, 3)}))
valid_schedule = st.fixed_dictionaries(
    {"format": st.just("workbench.schedule/1"), "mode": st.sampled_from(["serial", "concurrent"]),
     "buffers": st.fixed_dictionaries({b: st.fixed_dictionaries({"size": st.integers(0, 64), "initialized": st.booleans()})
                                       for b in BUFS}),
     "kernels": st.just({"add": {"inplace": [["x", "out"]]}}),
     "events": st.lists(ok_event, max_size=30)})


def check_doc(doc):
    try:
        sch = parse(json.dumps(doc))
    except ScheduleError as e:
        msg = str(e)
        assert msg and "\n" not in msg
        if e.event is not None:
            assert f"events[{e.event}]" in msg  # names the event index and the field
        return None
    hz = analyze(sch)
    n = len(sch.events)
    for h in hz:
        assert h.kind in KINDS and 0 <= h.event < n
        assert h.other is None or 0 <= h.other < h.event
        assert h.range is None or h.range[0] <= h.range[1]
        assert h.message
    return hz


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(schedule_like)
def test_schedule_like_documents_never_crash(doc):
    check_doc(doc)


@settings(max_examples=300, deadline=2000, database=None)
@given(valid_schedule)
def test_valid_schedules_analyse_and_round_trip(doc):
    hz = check_doc(doc)
    assert hz is not None  # valid by construction
    # the normalized schedule written back is valid and gives the same hazards
    assert [h.to_dict() for h in analyze(parse(json.dumps(parse(json.dumps(doc)).to_dict())))] == \
        [h.to_dict() for h in hz]


@settings(max_examples=150, deadline=2000, database=None)
@given(json_any)
@example({"\n": None})  # found by CI: a newline in a field name must not break the one-line message
def test_arbitrary_json_never_crashes(doc):
    assert check_doc(doc) is None  # arbitrary JSON is never a valid schedule


@settings(max_examples=150, deadline=2000, database=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(data):
    try:
        parse(data)
    except ScheduleError as e:
        assert str(e)


@settings(max_examples=40, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(st.one_of(schedule_like, json_any.map(json.dumps), st.binary(max_size=100)))
def test_cli_exit_codes_only(tmp_path_factory, doc):
    d = tmp_path_factory.mktemp("fz")
    p = d / "s.json"
    if isinstance(doc, bytes):
        p.write_bytes(doc)
    else:
        p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    assert cli_main(["hazards", str(p), "--json"]) in (0, 1, 2)


def test_deep_nesting_and_huge_numbers_are_clean_errors():
    for text in ["[" * 100000 + "]" * 100000,
                 '{"format": "workbench.schedule/1", "mode": "serial", "events": [], "buffers": {"a": {"size": '
                 + "9" * 5000 + "}}}"]:
        try:
            parse(text)
        except ScheduleError as e:
            assert "JSON" in str(e) or "buffers" in str(e)
        else:
            raise AssertionError("accepted")


def test_huge_ranges_do_not_hang():
    big = 2**62
    doc = {"format": "workbench.schedule/1", "mode": "concurrent", "buffers": {"a": {"size": big}},
           "events": [{"type": "dispatch", "name": f"op{i}",
                       "reads": [{"buffer": "a", "offset": (i * 7919) % big, "size": big // 3}],
                       "writes": [{"buffer": "a", "offset": (i * 104729) % big, "size": big // 5}]}
                      for i in range(2000)]}
    hz = analyze(doc)
    assert hz and all(h.range[1] <= big for h in hz if h.range)
