"""The precision test data of issue 39 (tests/data/engines/precision): consistent, and quiet today on clean runs.

The dumps were written by scripts/make_precision_dumps.py (transformers in float32, bfloat16 and
float16 as the engine; torch is not needed here).  These tests check the data itself (the
manifest against the files, each bug entering at the op the manifest names, no precision
metadata, values that are what the engine's dtype makes).  What the diff says of each case,
clean and planted, is tests/test_diff_precision.py.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest


HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "engines" / "precision"
sys.path.insert(0, str(HERE / "data"))
MANIFEST = json.loads((DATA / "manifest.json").read_text())
CASES = MANIFEST["cases"]
DTYPES = ("float32", "bfloat16", "float16")
CLEAN = ("clean", "decode_clean")


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])


def _load(path: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from make_arch_refs import HERE as ARCHS, write_checkpoint

    root = tmp_path_factory.mktemp("precision")
    return {c: str(write_checkpoint(root / c, ARCHS / c)) for c in {c["checkpoint"] for c in CASES}}


@pytest.fixture(scope="module")
def programs(ckpt):
    import workbench

    return {c: list(workbench.load(p).program.names) for c, p in ckpt.items()}


# ------------------------------------------------------------------ the manifest against the files
def test_every_file_listed_exists_and_every_file_is_listed():
    listed = [c["file"] for c in CASES]
    assert len(listed) == len(set(listed))
    assert all((DATA / f).is_file() for f in listed)
    on_disk = {p.name for p in DATA.iterdir()} - {"manifest.json", "README.md"}
    assert on_disk == set(listed)
    for d in MANIFEST["dropped"]:  # dropped for a ratio below the minimum: no file
        assert d["file"] is None and d["ratio"] < MANIFEST["min_ratio"]
        tag = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[d["engine_dtype"]]
        assert not (DATA / f"{d['arch']}_{tag}_{d['bug']}.safetensors").exists()


def test_ratios_and_clean_pairs():
    for c in CASES:
        if c["bug"] in CLEAN:
            assert c["entry_op"] is None and c["ratio"] is None
            continue
        assert c["ratio"] >= MANIFEST["min_ratio"], c["file"]
        assert c["ratio"] == pytest.approx(c["effect_nmse"] / c["rounding_nmse"])
        assert c["clean_file"] in {x["file"] for x in CASES}  # the same dtype's clean run is committed
        clean = next(x for x in CASES if x["file"] == c["clean_file"])
        assert (clean["engine_dtype"], clean["arch"], clean["decode"], clean["layout"]) == \
               (c["engine_dtype"], c["arch"], c["decode"], c["layout"])


def test_clean_cases_exist_for_each_dtype():
    pairs = {(c["arch"], c["engine_dtype"], c["decode"]) for c in CASES}
    clean = {(c["arch"], c["engine_dtype"], c["decode"]) for c in CASES if c["bug"] in CLEAN}
    assert pairs == clean  # every (arch, dtype) with a bug case has its clean run
    assert {c["engine_dtype"] for c in CASES if c["bug"] == "clean"} == set(DTYPES)
    assert {c["engine_dtype"] for c in CASES if c["bug"] == "decode_clean"} == set(DTYPES)
    assert {c["arch"] for c in CASES if c["bug"] == "clean" and c["engine_dtype"] == "bfloat16"} == \
           {"llama", "qwen3", "gemma3", "gemma4"}


def test_entry_ops_are_ops_of_the_program(programs):
    for c in CASES + MANIFEST["dropped"]:
        if c["entry_op"] is not None:
            assert c["entry_op"] in programs[c["checkpoint"]], (c["file"], c["entry_op"])


def test_dumps_carry_no_precision_metadata():
    for c in CASES:
        if not c["file"].endswith(".safetensors"):
            continue
        h = _header(DATA / c["file"])
        meta = h.pop("__metadata__", {})
        assert set(meta) == {"workbench.engine", "workbench.ids"}, c["file"]
        assert meta["workbench.engine"] == c["engine"]
        assert json.loads(meta["workbench.ids"]) == MANIFEST["ids"]
        assert {t["dtype"] for t in h.values()} == {"F32"}, c["file"]


# ------------------------------------------------------------------ the data is what it says
@pytest.mark.parametrize("case", [c for c in CASES if c["bug"] in CLEAN and c["layout"] == "torch_hooks"],
                         ids=lambda c: c["file"])
def test_values_are_the_engine_dtype(case):
    """A bfloat16 / float16 engine's values are all representable in its dtype; a float32
    engine's are not (so a precision can be read off the values, not the metadata)."""
    arrays = _load(DATA / case["file"])

    def fits(v, dt):
        if dt == "bfloat16":
            return bool((v.view(np.uint32) & 0xFFFF == 0).all())
        with np.errstate(over="ignore"):
            return bool((v.astype(np.float16).astype(np.float32) == v).all())

    bf = [fits(v, "bfloat16") for v in arrays.values()]
    f16 = [fits(v, "float16") for v in arrays.values()]
    if case["engine_dtype"] == "bfloat16":
        assert all(bf)
    elif case["engine_dtype"] == "float16":
        assert all(f16) and not any(bf)
    else:
        assert not any(bf) and not any(f16)


@pytest.mark.parametrize("case", [c for c in CASES if c["bug"] not in CLEAN and c["layout"] == "torch_hooks"],
                         ids=lambda c: c["file"])
def test_bug_enters_at_its_op(programs, case):
    """The first op (in our program's order) where the buggy dump differs from its clean run of
    the same dtype is the manifest's entry op; everything before it is bit-identical."""
    from workbench.diff.engines import load

    adapter = load("transformers")
    prog = programs[case["checkpoint"]]
    ops = set(prog)
    bug, clean = _load(DATA / case["file"]), _load(DATA / case["clean_file"])
    assert set(bug) == set(clean)
    differ = set()
    for name in bug:
        op, _ = adapter.op_for(name, ops)
        if op and not np.array_equal(bug[name], clean[name]):
            differ.add(op)
    assert next(o for o in prog if o in differ) == case["entry_op"]


def test_llama_cpp_dict_keeps_the_last_value_per_name():
    """One tensor per GGML name: ``Qcur-N`` / ``Kcur-N`` hold Q / K after RoPE (the last node
    printed under the name), as a cb_eval hook writing a dict keeps them."""
    from workbench.diff.ggml_text import read_eval_callback

    for c in CASES:
        if c["layout"] != "cb_eval dict":
            continue
        d = _load(DATA / c["file"])
        text, _, known = read_eval_callback(DATA / c["file"].replace(".ggml.safetensors", ".ggml.txt"))
        bases = {n.split("@")[0] for n in text}
        assert set(d) == bases
        for name in ("Qcur-0", "Kcur-1"):
            t, k = text[f"{name}@ROPE"], known[f"{name}@ROPE"]
            assert d[name].shape == t.shape
            assert np.abs(d[name][k] - t[k]).max() <= 5e-5 + 1e-6  # %12.4f
        v, k = text["Qcur-0@MUL_MAT"], known["Qcur-0@MUL_MAT"]
        assert d["Qcur-0"].size == v.size and not np.allclose(d["Qcur-0"].reshape(v.shape)[k], v[k], atol=1e-3)
