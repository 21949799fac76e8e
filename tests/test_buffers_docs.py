"""docs/schedule.md: the worked example gives the hazards the page shows, and its fix is clean."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from workbench.buffers import analyze

DOC = Path(__file__).resolve().parent.parent / "docs" / "schedule.md"


def example() -> dict:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/schedule.md lost its worked example"
    return json.loads(blocks[0])


def test_worked_example_hazards_as_documented():
    hz = analyze(example())
    assert [(h.kind, h.event, h.other) for h in hz] == [("alias-in-dispatch", 8, None), ("cb-reuse", 12, 11),
                                                        ("cb-reuse", 13, 11)]
    assert "Give layers.0.self_attn.o_proj its own output buffer" in hz[0].message


def test_documented_fix_is_clean_and_dropping_a_barrier_is_raw():
    doc = example()
    ev = doc["events"]
    doc["buffers"]["attnH"] = {"size": 4096}
    sdpa, o_proj = ev[6], ev[8]
    sdpa["writes"][0]["buffer"] = "attnH"
    o_proj["reads"][0]["buffer"] = "attnH"
    ev[12]["cb"] = 2
    ev[13]["cb"] = 2
    ev[14]["cb"] = 2
    assert analyze(doc) == []
    no_bar = copy.deepcopy(doc)
    del no_bar["events"][7]   # the barrier before o_proj
    assert [(h.kind, h.event, h.other) for h in analyze(no_bar)] == [("raw", 7, 6)]
