"""Property-based fuzzing of the reader: mutated header bytes, header lengths, file lengths
and index files never raise anything but CheckpointError, never hang, and never read a
file outside the checkpoint directory."""
import builtins
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench
from workbench import zoo
from workbench.checkpoint import CheckpointError

BASE = Path(tempfile.mkdtemp(prefix="wb-fuzz-"))
SINGLE = zoo.build("qwen3", BASE / "single", quant="affine4", tokenizer=False)
SHARDED = zoo.build("gemma4_moe", BASE / "sharded", shards=2, tokenizer=False, num_hidden_layers=2,
                    layer_types=["sliding_attention", "full_attention"])
SECRET = BASE / "secret.safetensors"
shutil.copy(SINGLE / "model.safetensors", SECRET)
FILE_BYTES = (SINGLE / "model.safetensors").read_bytes()
HEADER_END = 8 + struct.unpack("<Q", FILE_BYTES[:8])[0]
INDEX = json.loads((SHARDED / "model.safetensors.index.json").read_text())

SETTINGS = settings(max_examples=60, deadline=5000, suppress_health_check=list(HealthCheck), derandomize=True,
                    database=None)


class Guard:
    """Records every path opened for reading; fails on one outside ``root``."""

    def __init__(self, root: Path, monkeypatch):
        self.root = str(root.resolve())
        self.outside = []
        real_open, real_os_open = builtins.open, os.open

        def check(p):
            if isinstance(p, int):
                return
            ap = os.path.realpath(os.fspath(p))
            if not ap.startswith(self.root + os.sep) and ap != self.root and "site-packages" not in ap \
                    and not ap.startswith(("/proc", "/sys", "/dev", "/usr", "/etc/ld")):
                self.outside.append(ap)

        def spy_open(p, *a, **k):
            check(p)
            return real_open(p, *a, **k)

        def spy_os_open(p, *a, **k):
            check(p)
            return real_os_open(p, *a, **k)

        monkeypatch.setattr(builtins, "open", spy_open)
        monkeypatch.setattr(os, "open", spy_os_open)


def _run(d: Path, values: bool):
    try:
        r = workbench.inspect(d, values=values, progress=False)
    except CheckpointError as e:
        assert str(e)
        return None
    json.dumps(r.to_dict(), allow_nan=False)
    r.render()
    return r


def _fresh(name: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=name, dir=BASE))
    return d


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    shutil.rmtree(BASE, ignore_errors=True)


@SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, HEADER_END - 1), st.integers(0, 255)), min_size=1, max_size=8),
       values=st.booleans())
def test_header_byte_mutations(edits, values):
    d = _fresh("hb")
    shutil.copy(SINGLE / "config.json", d / "config.json")
    b = bytearray(FILE_BYTES)
    for pos, val in edits:
        b[pos] = val
    (d / "model.safetensors").write_bytes(bytes(b))
    r = _run(d, values)
    if r is not None and any(pos >= 8 for pos, _ in edits) and r.ok:
        # a mutation that leaves a sound header must still describe the same tensors
        assert r.num_layers == 3


@SETTINGS
@given(length=st.one_of(st.integers(0, 2**64 - 1), st.integers(0, HEADER_END + 64)),
       cut=st.one_of(st.none(), st.integers(0, len(FILE_BYTES))))
def test_header_length_and_file_length(length, cut):
    d = _fresh("hl")
    shutil.copy(SINGLE / "config.json", d / "config.json")
    b = struct.pack("<Q", length) + FILE_BYTES[8:]
    if cut is not None:
        b = b[:cut]
    (d / "model.safetensors").write_bytes(b)
    r = _run(d, values=True)
    if length != HEADER_END - 8 or (cut is not None and cut < len(FILE_BYTES)):
        assert r is None or not r.ok


_paths = st.sampled_from(["../secret.safetensors", "/etc/passwd", "a/../../secret.safetensors",
                          str(SECRET), "..", ".", "", "sub/../model-00001-of-00002.safetensors",
                          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "nonexistent.safetensors", "x\\..\\..\\secret.safetensors"])
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                     max_leaves=10)


@SETTINGS
@given(repl=st.dictionaries(st.sampled_from(sorted(INDEX["weight_map"])), _paths | _json, max_size=6),
       extra=st.dictionaries(st.text(max_size=12), _paths, max_size=3),
       garbage=st.one_of(st.none(), st.binary(max_size=40)),
       values=st.booleans())
def test_index_mutations(monkeypatch, repl, extra, garbage, values):
    d = _fresh("ix")
    for f in SHARDED.iterdir():
        if f.name != "model.safetensors.index.json":
            shutil.copy(f, d / f.name)
    if garbage is not None:
        (d / "model.safetensors.index.json").write_bytes(garbage)
    else:
        idx = json.loads(json.dumps(INDEX))
        idx["weight_map"].update(repl)
        idx["weight_map"].update(extra)
        (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with monkeypatch.context() as m:
        g = Guard(d, m)
        r = _run(d, values)
    assert not g.outside, g.outside
    escaping = [v for v in list(repl.values()) + list(extra.values())
                if isinstance(v, str) and ("secret" in v or v.startswith("/etc"))]
    if garbage is None and escaping and r is not None:
        assert "path-escape" in r.codes()


@SETTINGS
@given(cfg=_json | st.fixed_dictionaries({"model_type": st.sampled_from(["qwen3", "gemma4", "llama", "x"]),
                                          "num_hidden_layers": st.one_of(st.integers(-2, 400), st.text(max_size=3),
                                                                             st.integers(10**4, 10**12)),
                                          "hidden_size": st.integers(-1, 128)}))
def test_config_mutations(cfg):
    d = _fresh("cf")
    shutil.copy(SINGLE / "model.safetensors", d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(cfg))
    r = _run(d, values=False)
    assert r is not None  # the weights are readable: a bad config is a finding, not unusable input
    assert r.problems
    if isinstance(cfg, dict) and cfg.get("model_type") == "x":
        assert [p.code for p in r.problems] == ["bad-config"]  # unknown family: weights unchecked
    assert not r.ok  # (an unknown family too: nothing builds it, never vouched for)


def test_guard_sees_outside_reads(monkeypatch):
    d = _fresh("g")
    with monkeypatch.context() as m:
        g = Guard(d, m)
        open(SECRET, "rb").close()
    assert g.outside == [str(SECRET.resolve())]


def test_path_escape_is_never_opened(monkeypatch):
    d = _fresh("pe")
    for f in SHARDED.iterdir():
        shutil.copy(f, d / f.name)
    idx = json.loads(json.dumps(INDEX))
    name = sorted(idx["weight_map"])[0]
    idx["weight_map"][name] = "../" + SECRET.name
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with monkeypatch.context() as m:
        g = Guard(d, m)
        r = workbench.inspect(d, values=True, progress=False)
    assert not g.outside
    (p,) = [p for p in r.problems if p.code == "path-escape"]
    assert p.tensor == name and SECRET.name in p.message and p.file == "model.safetensors.index.json"


_HDR = json.loads(FILE_BYTES[8:HEADER_END])
_NAMES = sorted(k for k in _HDR if k != "__metadata__")


@SETTINGS
@given(edits=st.lists(st.tuples(st.sampled_from(_NAMES), st.sampled_from(["dtype", "shape", "data_offsets"]),
                                _json | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)),
                      min_size=1, max_size=4),
       model_type=st.one_of(st.none(), _json))
def test_header_and_config_values_of_any_json_type(edits, model_type):
    """Any JSON value as a tensor's dtype / shape / data_offsets (lists, objects, floats, huge
    integers) is a finding naming the tensor; any non-string model_type is unusable input
    naming the key. Never another exception."""
    d = _fresh("hv")
    hdr = json.loads(json.dumps(_HDR))
    for name, key, value in edits:
        hdr[name][key] = value
    raw = json.dumps(hdr).encode()
    raw += b" " * (-len(raw) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + FILE_BYTES[HEADER_END:])
    cfg = json.loads((SINGLE / "config.json").read_text())
    if model_type is not None:
        cfg["model_type"] = model_type
    (d / "config.json").write_text(json.dumps(cfg))
    try:
        r = workbench.inspect(d, progress=False)
    except CheckpointError as e:
        assert model_type is not None and not isinstance(model_type, str) and "model_type" in str(e)
        return
    json.dumps(r.to_dict(), allow_nan=False)
    changed = {n for n, k, v in edits if _HDR[n][k] != v}
    for n in changed:
        assert any(p.tensor == n or n in p.message for p in r.problems), n
