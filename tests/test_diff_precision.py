"""Rounding or a bug, on real engines of every precision (issue 39).

Every dump of tests/data/engines/precision (transformers as the engine in float32, bfloat16
and float16; llama.cpp in both layouts; written as plain hooks write them: every tensor
float32, no word of the engine's precision; scripts/make_precision_dumps.py) is diffed with
the default options and no flag: each planted bug (a norm eps, a bfloat16 accumulation, a
float8-rounded weight, RoPE frequencies 2% off, a (1 + w) / w norm scale, a decode step's
position off by one) must be named at the op where it enters, and no clean run of any
precision flagged.  The manifest keeps only bugs whose effect at that op is at least 10x
the rounding of that precision there.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from workbench.diff import budget, compare

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "engines" / "precision"
sys.path.insert(0, str(HERE / "data"))
MANIFEST = json.loads((DATA / "manifest.json").read_text())
CASES = MANIFEST["cases"]
CLEAN = ("clean", "decode_clean")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from make_arch_refs import HERE as ARCHS, write_checkpoint

    root = tmp_path_factory.mktemp("precision")
    return {a: str(write_checkpoint(root / a, ARCHS / a)) for a in sorted({c["checkpoint"] for c in CASES})}


def first_named(report):
    """The earlier of the first divergence and the first op wrong on its own inputs."""
    found = [o for o in (report.first_divergence, report.first_local_divergence) if o is not None]
    return min(found, key=lambda o: o.index) if found else None


@pytest.mark.parametrize("case", [c for c in CASES if c["bug"] in CLEAN], ids=lambda c: c["file"])
def test_no_clean_run_is_flagged(ckpt, case):
    r = compare(ckpt[case["checkpoint"]], str(DATA / case["file"]), ids=MANIFEST["ids"])
    assert r.clean, r.summary()
    assert r.decode == case["decode"]  # (a decode step read from its shapes: no flag, no metadata)
    if r.engine_precision is not None:  # (llama.cpp's printed text: no values to read a precision from)
        assert r.engine_precision.engine == case["engine_dtype"] and r.engine_precision.source == "values"
        judged = [o.ratio for o in r.ops if o.local_rule == "budget"]
        assert judged and max(judged) < budget.FACTOR / 2  # (calibration: the largest is 6.4)


@pytest.mark.parametrize("case", [c for c in CASES if c["bug"] not in CLEAN], ids=lambda c: c["file"])
def test_each_bug_is_named_where_it_enters(ckpt, case):
    r = compare(ckpt[case["checkpoint"]], str(DATA / case["file"]), ids=MANIFEST["ids"])
    o = first_named(r)
    assert o is not None and o.op == case["entry_op"], r.summary()
    assert not r.clean


def test_a_name_of_several_nodes_is_matched_where_it_fits(ckpt):
    """llama.cpp's Qcur-N kept once per name (a cb_eval hook filling a dict: the roped heads)
    once flagged q_proj on a clean run; it is compared with each op it may be."""
    r = compare(ckpt["llama"], str(DATA / "llama_f32_clean.ggml.safetensors"), ids=MANIFEST["ids"])
    assert r.clean
    q = r["layers.1.self_attn.q_rope"]
    assert q.engine_name == "Qcur-1" and "'Qcur-1' names several nodes: it fits layers.1.self_attn.q_rope" in q.layout
    assert "not layers.1.self_attn.q_proj" in q.layout


def test_a_name_fitting_other_than_its_last_node_is_said(ckpt):
    """An engine whose layer-1 RoPE did nothing: its dict keeps Qcur-1 = the projection, which
    fits q_proj, not q_rope; the report says so (summary and JSON) instead of staying silent."""
    from workbench.diff.ggml_text import read_eval_callback
    from workbench.diff.readers import read_dump

    eng, _ = read_dump(DATA / "llama_f32_clean.ggml.safetensors")
    printed, _, _ = read_eval_callback(DATA / "llama_f32_clean.ggml.txt")
    proj = next(k for k in printed if k.startswith("Qcur-1@MUL_MAT"))
    assert eng["Qcur-1"].size == printed[proj].size
    eng["Qcur-1"] = printed[proj].reshape(eng["Qcur-1"].shape)  # (4 decimals: the printed corner, NaN elsewhere)
    r = compare(ckpt["llama"], eng, ids=MANIFEST["ids"], engine_adapter="llama.cpp")
    assert any("'Qcur-1' fits layers.1.self_attn.q_proj better than layers.1.self_attn.q_rope" in c
               for c in r.cautions), r.cautions
    assert "caution: 'Qcur-1'" in r.summary() and r.to_dict()["cautions"] == r.cautions
    assert not compare(ckpt["llama"], str(DATA / "llama_f32_clean.ggml.safetensors"), ids=MANIFEST["ids"]).cautions
