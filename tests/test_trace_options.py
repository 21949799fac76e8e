"""``trace()``'s options grouped by concern (workbench/trace/options.py): the groups and the
old flat keywords give the same trace, the old keywords warn once per call, an unknown
keyword is one TypeError naming the groups, and every group's defaults are the old ones."""
from __future__ import annotations

import inspect
import warnings
from dataclasses import fields

import numpy as np
import pytest

import mlx.core as mx
import workbench
from workbench.demo import paths
from workbench.trace import Positions, Run, Storage
from workbench.trace.options import FLUSH_BYTES, GROUPS, OLD_KEYWORDS
from workbench.trace.tracer import Trace

IDS = [2, 15, 16, 17, 18, 19]

#: trace()'s keywords and their defaults before they were grouped (issue 43)
OLD_DEFAULTS = {"cache": None, "attention_mask": None, "pad_id": None, "memory_budget": None, "spill_dir": None,
                "flush_bytes": 512 * 2**20, "store": None, "key_prefix": "", "attention": None, "check_ids": True,
                "logits": None, "prune": False}


@pytest.fixture(scope="module")
def model():
    return workbench.load(paths.DEMO, dtype="float32")


def _same(a, b) -> None:
    """Two finished traces of the same forward: the same ops, steps, statistics and logits."""
    assert a.ops == b.ops and a.logit_positions == b.logit_positions
    assert [s.to_dict() for s in a.steps] == [s.to_dict() for s in b.steps]
    assert np.array_equal(np.array(a.logits), np.array(b.logits))


def test_every_group_default_is_the_old_default():
    got = {f.name: f.default for cls in (Positions, Run, Storage) for f in fields(cls)}
    assert got == OLD_DEFAULTS
    assert set(OLD_KEYWORDS) == set(OLD_DEFAULTS)
    assert FLUSH_BYTES == 512 * 2**20
    assert inspect.signature(Trace).parameters["flush_bytes"].default == FLUSH_BYTES
    for cls in (Positions, Run, Storage):  # frozen: a group is a value
        with pytest.raises(Exception):
            setattr(cls(), fields(cls)[0].name, 1)


def test_trace_takes_a_handful_of_top_level_options():
    params = [p for p in inspect.signature(workbench.trace.trace).parameters.values()
              if p.kind is not p.VAR_KEYWORD]
    names = [p.name for p in params]
    assert names == ["model", "ids_or_text", "capture", "dtype", "breakpoints", "interventions",
                     "positions", "run", "storage", "images", "audio"]
    assert set(GROUPS) == {"positions", "run", "storage"}


@pytest.mark.parametrize("old, new", [
    ({"attention": "explicit", "logits": "last"},
     {"run": Run(attention="explicit"), "positions": Positions(logits="last")}),
    ({"logits": slice(2, None), "flush_bytes": 1, "key_prefix": "k/"},
     {"positions": {"logits": slice(2, None)}, "storage": Storage(flush_bytes=1, key_prefix="k/")}),
    ({"attention": [1], "check_ids": False, "memory_budget": 0},
     {"run": {"attention": [1], "check_ids": False}, "storage": {"memory_budget": 0}}),
])
def test_both_spellings_give_identical_traces(model, tmp_path, old, new):
    with pytest.warns(DeprecationWarning):
        a = model.trace(IDS, capture="full", **old)
    b = model.trace(IDS, capture="full", **new)
    a.run()
    b.run()
    _same(a, b)
    for name in ("embed_tokens", "layers.1", "logits"):
        assert np.array_equal(np.array(a.value(name)), np.array(b.value(name)))


def test_both_spellings_of_a_batch_with_a_cache(model):
    batch = [[5, 6, 7], [8, 9]]
    c1, c2 = model.make_cache(), model.make_cache()
    with pytest.warns(DeprecationWarning):
        a = workbench.trace(model, batch, cache=c1, pad_id=3)
    b = workbench.trace(model, batch, run=Run(cache=c2), positions=Positions(pad_id=3))
    a.run()
    b.run()
    _same(a, b)
    assert np.array_equal(np.array(a.ids), np.array(b.ids)) and int(a.ids[1, 0]) == 3
    assert c1.offset == c2.offset == 3


def test_the_old_keywords_warn_once_per_call_naming_the_new_spelling(model):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        model.trace(IDS, attention="explicit", logits="last", prune=False, memory_budget=None)
    dep = [x for x in w if issubclass(x.category, DeprecationWarning)]
    assert len(dep) == 1
    msg = str(dep[0].message)
    assert "\n" not in msg
    for part in ("run=Run(attention=...)", "positions=Positions(logits=..., prune=...)",
                 "storage=Storage(memory_budget=...)"):
        assert part in msg
    assert dep[0].filename == __file__  # the user's line, so that a notebook shows it


def test_the_new_spelling_does_not_warn(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = model.trace(IDS, capture=None, positions=Positions(logits="last"), run=Run(attention="explicit"),
                        storage=Storage(flush_bytes=2**20))
        t.run()
    assert t.logit_positions == range(len(IDS) - 1, len(IDS))


def test_an_unknown_keyword_is_one_type_error_naming_it_and_the_groups(model):
    with pytest.raises(TypeError) as e:
        model.trace(IDS, atention="explicit")
    msg = str(e.value)
    assert "'atention'" in msg and "positions=Positions" in msg and "run=Run" in msg and "storage=Storage" in msg
    with pytest.raises(TypeError, match="Run takes attention, cache, check_ids"):
        model.trace(IDS, run={"atention": "explicit"})
    with pytest.raises(TypeError, match="takes a Storage"):
        model.trace(IDS, storage=123)
    with pytest.raises(TypeError, match="inside the group"):  # an old keyword beside its own group
        model.trace(IDS, attention="explicit", run=Run(check_ids=False))


def test_images_on_an_op_program_are_refused(model):
    with pytest.raises(workbench.trace.TraceError, match="images: only a module-level model"):
        model.trace(IDS, images=[np.zeros((4, 4, 3), np.uint8)])
    assert isinstance(model.trace(IDS).ids, mx.array)
