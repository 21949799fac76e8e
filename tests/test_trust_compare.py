"""Every comparison states its coverage and never vouches for a damaged side (issue 33, item 1).

A matrix of comparisons (``inspect --diff`` with and without ``--values``, ``diff`` of an
engine's activations, ``diff`` of an engine's weights) x damages (truncated data and
header, bad offsets, offsets pointing at another tensor's data, NaN / Inf, a missing or
renamed tensor, a dtype or shape change), each on either side: the exit status is the
promised one, an unusable side is one line naming the file, and no damaged comparison says
"same" or "no divergence".  Then a property: ``inspect --diff --values`` says "same" only
when the tensors' bytes are identical; and the issue's repros.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from workbench.cli import main
from workbench.checkpoint.inspect import diff as inspect_diff
from workbench.diff import compare, read_dump
from workbench.widgets import DiffView

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"
IDS = [2, 17, 3, 42, 8, 99, 23]
TARGET = "model.layers.1.mlp.down_proj.weight"   # BF16 [128, 384]
OTHER = "model.layers.2.mlp.down_proj.weight"    # same dtype and shape, other values
OP = "layers.1.mlp.down_proj"                    # an op of the reference dump (F32)
OP_OTHER = "layers.2.mlp.down_proj"
SAME = re.compile(r"\bsame\b")


# ----------------------------------------------------------------------------- safetensors surgery
def st_read(path: Path) -> tuple[dict, bytes]:
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_write(path: Path, hdr: dict, data: bytes) -> None:
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def st_rebuild(path: Path, edit) -> None:
    """Rewrite the file contiguously after ``edit(tensors)`` (name -> [dtype, shape, bytes])."""
    hdr, data = st_read(path)
    meta = hdr.pop("__metadata__", None)
    ts = {k: [v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in hdr.items()}
    edit(ts)
    out, blob, off = {}, [], 0
    if meta is not None:
        out["__metadata__"] = meta
    for k, (dt, shape, b) in ts.items():
        out[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blob.append(b)
        off += len(b)
    st_write(path, out, b"".join(blob))


NAN = {"BF16": b"\xc0\x7f", "F32": b"\x00\x00\xc0\x7f"}
INF = {"BF16": b"\x80\x7f", "F32": b"\x00\x00\x80\x7f"}


def _poke(path: Path, name: str, bits: dict) -> None:
    hdr, data = st_read(path)
    e = hdr[name]
    b = bytearray(data)
    b[e["data_offsets"][0]:e["data_offsets"][0] + len(bits[e["dtype"]])] = bits[e["dtype"]]
    st_write(path, hdr, bytes(b))


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _data_start(path: Path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def damage(path: Path, kind: str, name: str, other: str) -> None:
    """Damage one safetensors file in place (``name``: the tensor to damage, ``other``: one of its
    dtype and shape holding other values)."""
    size = path.stat().st_size
    if kind == "trunc-half":
        _truncate(path, size // 2)
    elif kind == "trunc-tenth":
        _truncate(path, size * 9 // 10)
    elif kind == "trunc-byte":
        _truncate(path, size - 1)
    elif kind == "trunc-header":
        _truncate(path, _data_start(path) // 2)
    elif kind == "bad-offsets":  # the span no longer fits dtype x shape
        hdr, data = st_read(path)
        a, b = hdr[name]["data_offsets"]
        hdr[name]["data_offsets"] = [a, b - 2]
        st_write(path, hdr, data)
    elif kind == "swapped-offsets":  # a sound header whose offsets point at another tensor's data
        hdr, data = st_read(path)
        hdr[name]["data_offsets"], hdr[other]["data_offsets"] = hdr[other]["data_offsets"], hdr[name]["data_offsets"]
        st_write(path, hdr, data)
    elif kind == "nan":
        _poke(path, name, NAN)
    elif kind == "inf":
        _poke(path, name, INF)
    elif kind == "missing":
        st_rebuild(path, lambda ts: ts.pop(name))
    elif kind == "renamed":
        st_rebuild(path, lambda ts: ts.__setitem__(name.replace("down_proj", "down_prj"), ts.pop(name)))
    elif kind == "dtype":  # BF16 -> F32 (the same values, exactly); F32 -> I32 (truncated to integers)
        def edit(ts):
            dt, shape, b = ts[name]
            if dt == "BF16":
                ts[name] = ["F32", shape, (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).tobytes()]
            else:
                ts[name] = ["I32", shape, np.frombuffer(b, np.float32).astype(np.int32).tobytes()]
        st_rebuild(path, edit)
    elif kind == "shape":  # a transposed matrix's shape (BF16 weight); one channel short (F32 activation)
        def edit(ts):
            dt, shape, b = ts[name]
            if dt == "BF16":
                ts[name] = [dt, shape[::-1], b]
            else:
                a = np.frombuffer(b, np.float32).reshape(shape)[..., :-1]
                ts[name] = [dt, list(a.shape), np.ascontiguousarray(a).tobytes()]
        st_rebuild(path, edit)
    else:
        raise AssertionError(kind)


DAMAGES = ["trunc-half", "trunc-tenth", "trunc-byte", "trunc-header", "bad-offsets", "swapped-offsets", "nan",
           "inf", "missing", "renamed", "dtype", "shape"]


def demo_copy(tmp_path: Path, kind: str | None) -> Path:
    d = tmp_path / f"ck-{kind or 'clean'}"
    shutil.copytree(DEMO, d)
    if kind:
        damage(d / "model.safetensors", kind, TARGET, OTHER)
    return d


def run(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def check_unusable(rc, out, err, *names):
    assert rc == 2, (rc, out, err)
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, err
    assert any(n in line for n in names), (line, names)


# ----------------------------------------------------------------------------- inspect --diff
# exit status by damage, header-only and with --values.  Header-only sees what `inspect` sees
# without reading data: swapped offsets and NaN / Inf are invisible to it, so it exits 0 --
# but says the headers match and the values were not compared, never "same".
INSPECT_EXPECT = {  # damage: (header-only, --values)
    "trunc-half": (1, 1), "trunc-tenth": (1, 1), "trunc-byte": (1, 1), "trunc-header": (1, 1),
    "bad-offsets": (1, 1), "swapped-offsets": (0, 1), "nan": (0, 1), "inf": (0, 1), "missing": (1, 1),
    "renamed": (1, 1), "dtype": (1, 1), "shape": (1, 1),
}


@pytest.mark.parametrize("values", [False, True], ids=["header", "values"])
@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("kind", DAMAGES)
def test_inspect_diff_never_vouches_for_a_damaged_side(tmp_path, capsys, kind, side, values):
    bad = demo_copy(tmp_path, kind)
    a, b = (bad, DEMO) if side == "a" else (DEMO, bad)
    flag = ["--values"] if values else []
    rc, out, err = run(["inspect", a, "--diff", b, *flag], capsys)
    assert rc == INSPECT_EXPECT[kind][values], (rc, out, err)
    assert not SAME.search(out), out
    if rc == 0:  # what it could not see, it says it did not look at
        assert out.rstrip().splitlines()[-1] == "  headers match (names, shapes, dtypes, quantization); values not compared: --values"
    rc2, js, _ = run(["inspect", a, "--diff", b, *flag, "--json"], capsys)
    d = json.loads(js)
    assert rc2 == rc and d["same"] is False and d["verdict"] != "same"
    cov = d["coverage"]
    assert cov["tensors"] >= 73 and cov["compared"] == cov["in_both"] <= cov["tensors"]
    assert f"compared: {cov['compared']} of {cov['tensors']} tensors" in out
    if values:
        assert cov["values_compared"] is not None and f"values: {cov['values_compared']} of {cov['in_both']}" in out
    # what inspect reports about the damaged side is what the comparison reports about it
    rc_alone, alone, _ = run(["inspect", bad, *flag, "--json"], capsys)
    codes = sorted({p["code"] for p in json.loads(alone)["problems"] if p["severity"] == "error"})
    assert sorted({p["code"] for p in d["problems"][side]}) == codes
    assert d["problems"]["b" if side == "a" else "a"] == []
    if codes:
        assert d["verdict"] == "damaged" and f"{side} is damaged" in out


@pytest.mark.parametrize("values", [False, True], ids=["header", "values"])
def test_inspect_diff_of_identical_copies(tmp_path, capsys, values):
    flag = ["--values"] if values else []
    rc, out, _ = run(["inspect", DEMO, "--diff", demo_copy(tmp_path, None), *flag, "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["verdict"] == ("same" if values else "headers-match") and d["same"] is values
    assert d["coverage"]["compared"] == d["coverage"]["tensors"] == 73
    assert d["coverage"]["values_compared"] == (73 if values else None)


def test_inspect_diff_both_sides_damaged_alike(tmp_path, capsys):
    """Two copies cut the same way hold the same bytes where they hold any: still not "same"."""
    a = demo_copy(tmp_path / "a", "trunc-byte")
    b = demo_copy(tmp_path / "b", "trunc-byte")
    for flag in ([], ["--values"]):
        rc, out, _ = run(["inspect", a, "--diff", b, *flag], capsys)
        assert rc == 1 and not SAME.search(out) and "a and b are damaged" in out, out


def test_inspect_diff_unusable_side_is_one_line(tmp_path, capsys):
    """A side that cannot be read as a checkpoint (its weights a FIFO, or no such path): exit 2,
    one line naming the file, as `inspect` alone."""
    import os
    d = demo_copy(tmp_path, None)
    (d / "model.safetensors").unlink()
    os.mkfifo(d / "model.safetensors")
    for a, b in ((d, DEMO), (DEMO, d), (DEMO, tmp_path / "nowhere")):
        for flag in ([], ["--values"]):
            rc, out, err = run(["inspect", a, "--diff", b, *flag], capsys)
            check_unusable(rc, out, err, str(d / "model.safetensors"), str(tmp_path / "nowhere"))
            assert out == ""


# ----------------------------------------------------------------------------- diff (activations, weights)
@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ref.safetensors"
    assert main(["dump", str(DEMO), "--ids", ",".join(map(str, IDS)), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def weights_dump(tmp_path_factory):
    """An engine's dump of the weights it loaded, under the checkpoint's canonical names (float32)."""
    from safetensors.numpy import save_file

    import workbench
    m = workbench.load(DEMO)
    names = [n for n in m.checkpoint.lm_names() if n.startswith(("layers.1.", "layers.2."))]
    from workbench.diff import weight_values
    out = tmp_path_factory.mktemp("w") / "weights.safetensors"
    save_file({n: np.ascontiguousarray(np.asarray(weight_values(m, n), np.float32)) for n in names}, str(out))
    return out


# the checkpoint side: workbench.load refuses what inspect finds (exit 2, one line naming the file);
# values it cannot see in headers (NaN, Inf, another tensor's data) reach the reference and diverge
DIFF_CKPT_EXPECT = {
    "trunc-half": 2, "trunc-tenth": 2, "trunc-byte": 2, "trunc-header": 2, "bad-offsets": 2, "swapped-offsets": 1,
    "nan": 1, "inf": 1, "missing": 2, "renamed": 2, "shape": 2,
    "dtype": 0,  # a float32 weight holding the bfloat16 values exactly: sound (inspect: OK), the same reference
}
# the engine side: an unreadable dump is unusable (2); NaN, Inf, integers, a wrong shape, another
# op's values are divergences (1); a dump whose names no longer match is matched by value, and says so
# (issue 42: the renamed dump holds the reference's own values, so it is clean: 0)
DIFF_ENGINE_EXPECT = {
    "trunc-half": 2, "trunc-tenth": 2, "trunc-byte": 2, "trunc-header": 2, "bad-offsets": 2, "swapped-offsets": 1,
    "nan": 1, "inf": 1, "missing": 1, "renamed": 0, "dtype": 1, "shape": 1,
}


def engine_damage(src: Path, dest: Path, kind: str, name: str, other: str) -> Path:
    """A damaged copy of an engine dump; "missing" keeps only ``name`` and the logits (a partial
    dump), "renamed" gives every tensor but ``name``, ``other`` and the logits a name of the
    engine's own (a dump whose names were not mapped)."""
    shutil.copy(src, dest)
    keep = {name, other, "logits"}
    if kind == "missing":
        def edit(ts):
            for k in list(ts):
                if k not in (name, "logits"):
                    ts.pop(k)
        st_rebuild(dest, edit)
    elif kind == "renamed":
        def edit(ts):
            for k in list(ts):
                if k not in keep:
                    ts["engine." + k] = ts.pop(k)
        st_rebuild(dest, edit)
    else:
        damage(dest, kind, name, other)
    return dest


@pytest.mark.parametrize("kind", DAMAGES)
def test_diff_damaged_checkpoint(tmp_path, capsys, ref, kind):
    bad = demo_copy(tmp_path, kind)
    rc, out, err = run(["diff", bad, ref, "--ids", ",".join(map(str, IDS)), "--no-local"], capsys)
    assert rc == DIFF_CKPT_EXPECT[kind], (rc, out, err)
    rc_inspect, _, _ = run(["inspect", bad], capsys)
    if rc == 0:  # only a checkpoint inspect finds sound, computing what the reference dump holds
        assert rc_inspect == 0 and out.startswith("no divergence: 143 ops compared")
        assert "coverage: compared 143 of the engine's 143 tensors" in out
        return
    assert "no divergence" not in out
    if rc == 2:
        assert rc_inspect == 1  # what inspect finds, load refuses
        check_unusable(rc, out, err, str(bad))
    else:
        assert out.startswith("first divergence: ")


@pytest.mark.parametrize("kind", DAMAGES)
def test_diff_damaged_engine_dump(tmp_path, capsys, ref, kind):
    eng = engine_damage(ref, tmp_path / "engine.safetensors", kind, OP, OP_OTHER)
    rc, out, err = run(["diff", DEMO, eng, "--ids", ",".join(map(str, IDS)), "--no-local"], capsys)
    if kind == "missing":  # two ops left, both ours and sound: a partial dump; it is what it compared
        rc, out, err = run(["diff", DEMO, eng, "--ids", ",".join(map(str, IDS)), "--no-local", "--json"], capsys)
        d = json.loads(out)
        assert rc == 0 and d["outcome"] == "no-divergence", (rc, out, err)
        assert d["coverage"]["compared"] == d["coverage"]["engine_tensors"] == 2 and d["coverage"]["ops"] == 143
        return
    assert rc == DIFF_ENGINE_EXPECT[kind], (rc, out, err)
    if kind == "renamed":  # what the names were taken to mean comes first (issue 42), then the verdict
        assert out.startswith("names matched by value (the engine's names matched 3 of its 143 tensors"), out
        assert "no divergence: 143 ops compared" in out and "coverage: compared 143 of the engine's 143" in out
        return
    assert "no divergence" not in out
    if rc == 2:
        check_unusable(rc, out, err, "engine.safetensors")
    else:
        assert out.startswith("first divergence: ") and "coverage: compared" in out, out


@pytest.mark.parametrize("kind", ["trunc-half", "trunc-byte", "trunc-header", "bad-offsets", "swapped-offsets",
                                  "nan", "inf", "dtype", "shape", "renamed"])
def test_diff_damaged_engine_weights(tmp_path, capsys, weights_dump, kind):
    """The weight compare behind DiffView: the engine's weights against the checkpoint's."""
    w1, w2 = "layers.1.mlp.down_proj.weight", "layers.2.mlp.down_proj.weight"
    eng = engine_damage(weights_dump, tmp_path / "engine.safetensors", kind, w1, w2)
    rc, out, err = run(["diff", DEMO, eng, "--ids", ",".join(map(str, IDS)), "--no-local", "--json"], capsys)
    if kind.startswith(("trunc", "bad")):
        check_unusable(rc, out, err, "engine.safetensors")
        return
    d = json.loads(out)
    if kind == "renamed":  # names of the engine's own (engine.X): mapped back by name (issue 42), then compared
        assert rc == 0 and d["outcome"] == "no-divergence", (rc, out, err)
        assert d["automap"]["rules"] == [["^engine\\.(.+)$", "\\1"]] and d["automap"]["ambiguous"] == []
        assert d["coverage"]["weights_compared"] == d["coverage"]["engine_tensors"] > 2
        return
    assert rc == 1 and d["outcome"] != "no-divergence", (rc, out, err)
    assert d["first_weight_mismatch"] == w1 or d["first_weight_mismatch"] == min(w1, w2)
    report = compare(DEMO, eng, ids=IDS, local=False)
    view = DiffView(report)
    assert "no divergence" not in view.summary.value


def test_diff_clean_weights_and_activations_are_vouched_for(capsys, ref, weights_dump):
    rc, out, _ = run(["diff", DEMO, weights_dump, "--ids", ",".join(map(str, IDS)), "--no-local", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["outcome"] == "no-divergence" and d["coverage"]["weights_compared"] == d["coverage"]["compared"] > 0
    rc, out, _ = run(["diff", DEMO, ref, "--ids", ",".join(map(str, IDS)), "--no-local"], capsys)
    assert rc == 0 and out.startswith("no divergence: 143 ops compared")
    assert "  coverage: compared 143 of the engine's 143 tensors (143 ops); 143 of our 143 ops" in out


# ----------------------------------------------------------------------------- the property
_BASE = {}


def _base(tmp_path_factory):
    if not _BASE:
        d = tmp_path_factory.mktemp("prop") / "base"
        shutil.copytree(DEMO, d)
        hdr, data = st_read(d / "model.safetensors")
        _BASE.update(dir=d, hdr=hdr, data=data, names=sorted(k for k in hdr if k != "__metadata__"))
    return _BASE


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(data=st.data())
def test_values_diff_says_same_only_for_identical_bytes(tmp_path_factory, data):
    base = _base(tmp_path_factory)
    hdr, raw = base["hdr"], bytearray(base["data"])
    name = data.draw(st.sampled_from(base["names"]), label="tensor")
    a, b = hdr[name]["data_offsets"]
    how = data.draw(st.sampled_from(["byte", "swap", "none"]), label="change")
    if how == "byte":  # any byte to any value (the same value included)
        i = data.draw(st.integers(a, b - 1), label="at")
        raw[i] = data.draw(st.integers(0, 255), label="value")
    elif how == "swap" and b - a >= 4:  # two elements exchanged: every statistic stays the same
        n = (b - a) // 2
        i, j = data.draw(st.integers(0, n - 1), label="i"), data.draw(st.integers(0, n - 1), label="j")
        x, y = raw[a + 2 * i:a + 2 * i + 2], raw[a + 2 * j:a + 2 * j + 2]
        raw[a + 2 * i:a + 2 * i + 2], raw[a + 2 * j:a + 2 * j + 2] = y, x
    d = base["dir"].parent / "changed"
    if not d.exists():
        shutil.copytree(base["dir"], d)
    st_write(d / "model.safetensors", dict(hdr), bytes(raw))
    res = inspect_diff(base["dir"], d, values=True, progress=False)
    identical = bytes(raw) == base["data"]
    assert res["same"] == identical, (name, how, res["values"], res["problems"])
    assert (res["verdict"] == "same") == identical
    if not identical and not res["problems"]["b"]:
        assert [v["tensor"] for v in res["values"]] != []


# ----------------------------------------------------------------------------- the repros
@pytest.mark.parametrize("cut", ["trunc-half", "trunc-tenth", "trunc-byte"])
def test_repro_cut_copy_is_never_same(tmp_path, capsys, cut):
    """issue 33: `inspect COPY --diff assets/demo` said "same", exit 0, in 12 of 16 comparisons."""
    bad = demo_copy(tmp_path, cut)
    rc, out, _ = run(["inspect", bad], capsys)
    assert rc == 1 and "truncated-file" in out
    for a, b in ((bad, DEMO), (DEMO, bad)):
        for flag in ([], ["--values"]):
            rc, out, _ = run(["inspect", a, "--diff", b, *flag], capsys)
            assert rc == 1 and "truncated-file" in out and "not vouched for" in out and not SAME.search(out)


def test_repro_mostly_unmatched_engine_names(tmp_path, capsys, ref):
    """issue 33: an engine whose names mostly do not match was compared on `lm_head` and
    `logits` alone; a RoPE bug upstream gave "no divergence", exit 0."""
    values, _ = read_dump(ref)
    eng = {}
    for op, x in values.items():
        if op in ("lm_head", "logits"):
            eng[op] = x  # the two names an engine shares with us
        else:
            y = x * 1.5 if op.endswith("q_rope") else x  # a RoPE bug, under names of the engine's own
            eng[f"model.{op}.output"] = y
    np.savez(tmp_path / "engine.npz", **eng)
    # no map: the names are matched by value (issue 42), said first, and the bug is found where it is
    rc, out, _ = run(["diff", DEMO, tmp_path / "engine.npz", "--ids", ",".join(map(str, IDS))], capsys)
    assert rc == 1 and "no divergence" not in out
    assert out.startswith("names matched by value (the engine's names matched 2 of its 143 tensors")
    assert "first divergence: layers.0.self_attn.q_rope" in out
    # the names kept as they are (an empty map): too little compared for a verdict
    none = tmp_path / "none.json"
    none.write_text("[]")
    rc, out, _ = run(["diff", DEMO, tmp_path / "engine.npz", "--ids", ",".join(map(str, IDS)), "--map", none], capsys)
    assert rc == 1 and "no divergence" not in out
    first, second = out.splitlines()[:2]  # the names matching nothing first, briefly, with the closest op (issue 29)
    assert first.startswith("engine tensors matching no op (141): model.embed_tokens.output (closest: embed_tokens)")
    assert "(+135; --json lists them)" in first
    assert second.startswith(
        "coverage too low for a verdict: compared 2 of the engine's 143 tensors (1%; a verdict needs 50%), "
        "2 of our 143 ops: map the engine's names")
    rc, js, _ = run(["diff", DEMO, tmp_path / "engine.npz", "--ids", ",".join(map(str, IDS)), "--map", none, "--json"],
                    capsys)
    d = json.loads(js)
    assert rc == 1 and d["outcome"] == "low-coverage" and d["first_divergence"] is None
    assert d["coverage"] == {"compared": 2, "engine_tensors": 143, "dropped": 0, "ops_compared": 2,
                             "weights_compared": 0, "ops": 143, "fraction": 2 / 143, "min_fraction": 0.5,
                             "enough": False}
    assert d["verdict"].startswith("coverage too low")
    report = compare(DEMO, tmp_path / "engine.npz", ids=IDS, rules=[])
    view = DiffView(report)
    assert "no divergence" not in view.summary.value and "coverage too low" in view.summary.value
    from workbench.plots import error_curve
    assert error_curve(report).axes[0].get_title() == ("engine vs reference: no verdict: 2 of the engine's 143 "
                                                       "tensors compared")
    # mapped, the same dump is compared whole and the bug is found where it is
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([[r"^model\.(.*)\.output$", "$1"]]))
    rc, out, _ = run(["diff", DEMO, tmp_path / "engine.npz", "--ids", ",".join(map(str, IDS)), "--map", rules], capsys)
    assert rc == 1 and out.startswith("first divergence: layers.0.self_attn.q_rope")
    assert "coverage: compared 143 of the engine's 143 tensors" in out


def test_dropped_names_leave_the_coverage_count(tmp_path, capsys, ref):
    """Tensors the rules map to "" are left out on purpose: they do not count against coverage."""
    values, _ = read_dump(ref)
    eng = {op: x for op, x in values.items() if op.startswith("layers.0")}
    eng.update({f"scratch.{i}": np.zeros(3, np.float32) for i in range(3 * len(eng))})
    np.savez(tmp_path / "engine.npz", **eng)
    args = ["diff", DEMO, tmp_path / "engine.npz", "--ids", ",".join(map(str, IDS)), "--no-local"]
    rc, out, _ = run(args, capsys)
    lines = out.splitlines()  # (few names ours: matched by value first, issue 42; nothing more found)
    assert rc == 1 and lines[2].startswith("coverage too low") and "no divergence" not in out
    assert lines[0].startswith("names matched by value (the engine's names matched 33 of its 132 tensors")
    assert lines[1].startswith("engine tensors matching no op (99): scratch.0, ")  # (issue 29: unmatched first)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([[r"^scratch\..*$", ""]]))
    rc, out, _ = run(args + ["--map", rules, "--json"], capsys)
    d = json.loads(out)
    n = len([k for k in eng if not k.startswith("scratch")])
    assert rc == 0 and d["outcome"] == "no-divergence"
    assert d["coverage"]["compared"] == d["coverage"]["engine_tensors"] == n and d["coverage"]["dropped"] == 3 * n
