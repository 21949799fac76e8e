"""The diff over plain arrays: readers, rules, layouts, metrics, first divergence."""
import json
import struct

import numpy as np
import pytest

import workbench  # noqa: F401  (fast BLAS before mlx)
from workbench.diff import (DiffError, DumpError, LayoutError, RulesError, Tolerance, compare_arrays,
                            compile_rules, error_metrics, load_rules, read_dump, reconcile, write_dump)
from workbench.diff.naming import apply_rules
from workbench.diff.readers import bf16_to_f32

rng = np.random.default_rng(0)
T, H, D, V = 5, 3, 4, 11


def _reference():
    names = ["embed_tokens", "layers.0.input_layernorm", "layers.0.self_attn.q_proj", "layers.0.self_attn.softmax",
             "layers.0", "layers.1.self_attn.q_proj", "layers.1", "norm", "logits"]
    shapes = {"layers.0.self_attn.softmax": (1, H, T, T), "logits": (1, T, V)}
    return {n: rng.normal(size=shapes.get(n, (1, T, H * D))).astype(np.float32) for n in names}


# ---------------------------------------------------------------- rules

def test_rules_compose_in_order_and_accept_dollar_groups():
    rules = compile_rules([[r"^blk\.(\d+)\.", "layers.$1."], [r"attn_q$", "self_attn.q_proj"],
                           [r"^(?P<x>tok)_embd$", r"\g<x>_embd_renamed"]])
    assert apply_rules("blk.12.attn_q", rules) == "layers.12.self_attn.q_proj"
    assert apply_rules("tok_embd", rules) == "tok_embd_renamed"
    assert apply_rules("unrelated", rules) == "unrelated"


@pytest.mark.parametrize("bad, msg", [
    ("notalist", "list of"), ([["a"]], "rule 0"), ([["(", "x"]], "does not compile"),
    ([["a", r"\2"]], "group 2"), ([[1, "x"]], "pair of strings")])
def test_bad_rules_are_named(bad, msg):
    with pytest.raises(RulesError, match=msg):
        compile_rules(bad)


def test_rules_file(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps([["^x$", "y"]]))
    assert apply_rules("x", load_rules(p)) == "y"
    p.write_text("{not json")
    with pytest.raises(RulesError, match="not JSON"):
        load_rules(p)
    with pytest.raises(RulesError, match="no such file"):
        load_rules(tmp_path / "missing.json")


# ---------------------------------------------------------------- layouts

def test_layout_reconciliation_cases():
    x = rng.normal(size=(T, H, D)).astype(np.float32)  # tokens, heads, head_dim
    merged = x.reshape(T, H * D)
    # batch dim dropped / added
    got, how = reconcile(merged, (1, T, H * D))
    assert np.array_equal(got[0], merged) and "size-1" in how
    # heads split -> merged and merged -> split
    assert np.array_equal(reconcile(x, (T, H * D))[0], merged)
    assert np.array_equal(reconcile(merged[None], (1, T, H, D))[0][0], x)
    # heads first [H, T, D] -> ours [T, H*D]
    got, how = reconcile(np.ascontiguousarray(x.transpose(1, 0, 2)), (1, T, H * D))
    assert np.array_equal(got[0], merged) and "transposed" in how
    # ours heads first [1, H, T, D], engine merged [T, H*D]
    got, _ = reconcile(merged, (1, H, T, D))
    assert np.array_equal(got[0], x.transpose(1, 0, 2))
    # plain transpose
    assert np.array_equal(reconcile(merged.T.copy(), (T, H * D))[0], merged)
    # same shape is taken as it is
    sq = rng.normal(size=(4, 4)).astype(np.float32)
    assert reconcile(sq, (4, 4))[0] is sq


def test_layout_errors():
    with pytest.raises(LayoutError) as e:
        reconcile(np.zeros((T, 7), np.float32), (T, H * D))
    assert e.value.kind == "shape" and "elements" in str(e.value)
    # same element count, but no split/merge/transpose gets there
    with pytest.raises(LayoutError) as e:
        reconcile(np.zeros((6, 10), np.float32), (4, 15))
    assert e.value.kind == "shape" and "cannot be brought" in str(e.value)
    # a full reversal of the axes is a transpose
    x = rng.normal(size=(2, 3, 5)).astype(np.float32)
    assert np.array_equal(reconcile(x, (5, 3, 2))[0], x.transpose(2, 1, 0))


def test_layout_ambiguous_is_reported():
    # engine [2, 3, 3] to ours [3, 6]: [3, (2, 3)] fits by swapping axes 0 and 1, or by swapping
    # the merged (2, 3) with the last 3: two different arrays, one transposition each
    with pytest.raises(LayoutError) as e:
        reconcile(rng.normal(size=(2, 3, 3)).astype(np.float32), (3, 6))
    assert e.value.kind == "ambiguous" and "different ways" in str(e.value)


# ---------------------------------------------------------------- metrics

def test_metrics_values():
    r = np.array([1.0, -2.0, 3.0, 0.0], np.float32)
    m = error_metrics(r, r)
    assert m["cosine"] == pytest.approx(1.0) and m["nmse"] == 0 and m["max_abs"] == 0
    e = r + np.array([0, 0, 0.5, 0], np.float32)
    m = error_metrics(r, e)
    assert m["max_abs"] == pytest.approx(0.5)
    assert m["nmse"] == pytest.approx((0.25 / 4) / np.var(r.astype(np.float64)))
    assert m["max_rel"] == pytest.approx(0.5 / 3.0)
    m = error_metrics(r, -r)
    assert m["cosine"] == pytest.approx(-1.0)
    # non-finite: counted per element, the new ones flagged
    e = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)
    m = error_metrics(r, e)
    assert m["nonfinite_engine"] == {"nan": 1, "posinf": 1, "neginf": 1}
    assert m["nonfinite_new"] == 3
    # a constant reference is normalised by its mean square
    c = np.full(4, 2.0, np.float32)
    assert error_metrics(c, c + 0.2)["nmse"] == pytest.approx(0.04 / 4.0)


def test_bf16_decoding_is_exact():
    vals = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(bf16_to_f32(bits), vals)


# ---------------------------------------------------------------- the diff

ENGINE_RULES = [[r"^tok_embd$", "embed_tokens"], [r"^blk\.(\d+)\.attn_norm$", "layers.$1.input_layernorm"],
                [r"^blk\.(\d+)\.attn_q$", "layers.$1.self_attn.q_proj"], [r"^blk\.(\d+)\.kq_soft_max$", "layers.$1.self_attn.softmax"],
                [r"^blk\.(\d+)\.l_out$", "layers.$1"], [r"^result_norm$", "norm"], [r"^result_output$", "logits"]]


def _engine(ref):
    """The reference renamed to llama.cpp-style names, in engine layouts (no batch, heads first)."""
    inv = {"embed_tokens": "tok_embd", "norm": "result_norm", "logits": "result_output"}
    out = {}
    for n, v in ref.items():
        if n in inv:
            en = inv[n]
        else:
            parts = n.split(".")
            i = parts[1]
            tail = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.softmax": "kq_soft_max"}
            en = f"blk.{i}.l_out" if len(parts) == 2 else f"blk.{i}.{tail['.'.join(parts[2:])]}"
        x = v[0]
        if n.endswith("q_proj"):
            x = x.reshape(T, H, D).transpose(1, 0, 2)  # heads first
        out[en] = np.ascontiguousarray(x).astype(np.float16)
    return out


def test_untouched_engine_has_no_divergence():
    ref = _reference()
    eng = _engine(ref)
    r = compare_arrays(ref, eng, rules=ENGINE_RULES)
    assert r.first_divergence is None
    assert r.compared == len(ref) and r.unmatched_engine == [] and r.unmatched_reference == []
    d = r.to_dict()
    assert d["first_divergence"] is None and d["compared"] == len(ref)
    assert all(o["status"] == "ok" and o["cosine"] > 0.9999 for o in d["ops"])
    assert [o["op"] for o in d["ops"]] == list(ref)  # our execution order


def test_perturbed_op_is_first_divergence_and_later_ones_follow():
    ref = _reference()
    eng = _engine(ref)
    eng["blk.0.attn_q"] = eng["blk.0.attn_q"] * np.float16(1.3) + np.float16(0.2)
    eng["blk.1.l_out"] = eng["blk.1.l_out"][::-1].copy()  # also wrong, but later
    eng["blk.0.ffn_gate"] = np.zeros((T, 8), np.float16)  # maps to nothing
    r = compare_arrays(ref, eng, rules=ENGINE_RULES, inputs={"layers.0.self_attn.q_proj": ("layers.0.input_layernorm",)})
    fd = r.first_divergence
    assert fd.op == "layers.0.self_attn.q_proj" and fd.engine_name == "blk.0.attn_q"
    d = r.to_dict()
    assert set(d["first_divergence"]) >= {"op", "cosine", "nmse", "max_abs"}
    assert d["first_divergence"]["inputs"] == [{"op": "layers.0.input_layernorm", "status": "ok"}]
    assert r["layers.1"].status == "diverged"
    assert d["unmatched_engine"] == ["blk.0.ffn_gate"]
    json.dumps(d, allow_nan=False)  # strict JSON
    assert "first divergence: layers.0.self_attn.q_proj" in r.summary()


def test_tolerance_is_overridable():
    ref = _reference()
    eng = _engine(ref)
    eng["blk.0.attn_q"] = eng["blk.0.attn_q"] + np.float16(0.05)
    assert compare_arrays(ref, eng, rules=ENGINE_RULES).first_divergence is None
    strict = compare_arrays(ref, eng, rules=ENGINE_RULES, tolerance={"max_abs": 0.01})
    assert strict.first_divergence.op == "layers.0.self_attn.q_proj"
    with pytest.raises(ValueError, match="unknown tolerance"):
        Tolerance.from_any({"cos": 1})


def test_unmatched_both_ways_and_suggestions():
    ref = _reference()
    eng = {"layers.0.self_attn.q_prj": ref["layers.0.self_attn.q_proj"], "layers.0": ref["layers.0"]}
    r = compare_arrays(ref, eng)
    assert r.compared == 1
    assert r.unmatched_engine == ["layers.0.self_attn.q_prj"]
    assert r.suggestions["layers.0.self_attn.q_prj"] == "layers.0.self_attn.q_proj"
    assert "layers.0.self_attn.q_proj" in r.unmatched_reference and "logits" in r.unmatched_reference
    assert len(r.unmatched_reference) == len(ref) - 1


def test_nonfinite_and_shape_divergences():
    ref = _reference()
    eng = {k: v.copy() for k, v in ref.items()}
    eng["layers.0.self_attn.softmax"][0, 0, 0, 0] = np.nan
    eng["layers.1"] = np.zeros((T, 7), np.float32)
    r = compare_arrays(ref, eng)
    assert r.first_divergence.op == "layers.0.self_attn.softmax"
    assert "non-finite" in r.first_divergence.reasons[0]
    assert r["layers.1"].status == "shape" and r["layers.1"].is_divergence


def test_two_engine_tensors_for_one_op_is_an_error():
    ref = _reference()
    with pytest.raises(DiffError, match="both map to op"):
        compare_arrays(ref, {"a": ref["norm"], "b": ref["norm"]}, rules=[["^[ab]$", "norm"]])


# ---------------------------------------------------------------- readers

def test_readers_roundtrip_all_formats(tmp_path):
    ref = _reference()
    eng = _engine(ref)
    # safetensors, with bf16 written by hand
    from safetensors.numpy import save_file
    save_file({k: v for k, v in eng.items()}, str(tmp_path / "e.safetensors"))
    np.savez(tmp_path / "e.npz", **eng)
    (tmp_path / "npy" / "blk.0").mkdir(parents=True)
    for k, v in eng.items():
        np.save(tmp_path / "npy" / f"{k}.npy", v)
    np.save(tmp_path / "npy" / "blk.0" / "nested.npy", np.ones(3, np.float32))
    for p in ("e.safetensors", "e.npz", "npy"):
        got, _ = read_dump(tmp_path / p)
        for k, v in eng.items():
            assert got[k].dtype == np.float32 and np.array_equal(got[k], v.astype(np.float32)), (p, k)
    got, _ = read_dump(tmp_path / "npy")
    assert "blk.0/nested" in got


def test_bf16_safetensors(tmp_path):
    vals = np.array([[1.0, -2.5], [3.140625, 0.0]], np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
    header = json.dumps({"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    got, _ = read_dump(tmp_path / "b.safetensors")
    assert np.array_equal(got["x"], vals)


def test_write_dump_metadata(tmp_path):
    ref = _reference()
    write_dump(tmp_path / "r.safetensors", ref, list(ref), {"workbench.ids": "[1, 2]"})
    got, meta = read_dump(tmp_path / "r.safetensors")
    assert json.loads(meta["workbench.op_order"]) == list(ref)
    assert meta["workbench.ids"] == "[1, 2]" and set(got) == set(ref)


def test_unusable_dumps_are_named(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05")
    with pytest.raises(DumpError, match="too short"):
        read_dump(bad)
    bad.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    with pytest.raises(DumpError, match="runs past the end"):
        read_dump(bad)
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(DumpError, match=r"cut off, first 'x' at byte \d+"):
        read_dump(bad)
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DumpError, match="pickle"):
        read_dump(tmp_path / "obj.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match="no .npy"):
        read_dump(tmp_path / "empty")
    with pytest.raises(DumpError, match="no such file"):
        read_dump(tmp_path / "nope.npz")
    np.save(tmp_path / "one.npy", np.ones(3))
    with pytest.raises(DumpError, match="no tensor names"):
        read_dump(tmp_path / "one.npy")
    # the user's files are never modified
    before = (tmp_path / "obj.npz").read_bytes()
    with pytest.raises(DumpError):
        read_dump(tmp_path / "obj.npz")
    assert (tmp_path / "obj.npz").read_bytes() == before


@pytest.mark.parametrize("offset, noise", [(0.0, 1e-4), (0.0, 0.3), (100.0, 1e-3), (0.0, 1e-6)])
def test_metrics_match_float64_definitions(offset, noise):
    g = np.random.default_rng(7)
    r = (g.normal(size=200_000) + offset).astype(np.float32)
    e = (r + g.normal(size=r.size) * noise).astype(np.float32)
    m = error_metrics(r, e)
    r64, e64 = r.astype(np.float64), e.astype(np.float64)
    one_minus_cos = 1 - np.dot(r64, e64) / np.sqrt(np.dot(r64, r64) * np.dot(e64, e64))
    assert 1 - m["cosine"] == pytest.approx(one_minus_cos, rel=1e-2, abs=1e-12)
    assert m["nmse"] == pytest.approx(np.mean((e64 - r64) ** 2) / np.var(r64), rel=1e-3)
    assert m["max_abs"] == pytest.approx(np.abs(e64 - r64).max(), rel=1e-6)


def test_mask_fill_is_left_out():
    r = np.array([1.0, 2.0, -3.4e38, -np.inf, 3.0], np.float32)
    e = np.array([1.0, 2.0, -np.inf, -65504.0, 3.0], np.float32)
    m = error_metrics(r, e)
    assert m["masked"] == 2 and m["nmse"] == 0 and m["nonfinite_new"] == 0
    m = error_metrics(r, e, mask_below=None)
    assert m["masked"] == 0 and m["nonfinite_new"] == 1


def test_bfloat16_npy_as_two_byte_void(tmp_path):
    vals = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
    np.save(tmp_path / "x.npy", bits.view("V2"))  # what ml_dtypes' bfloat16 (or an engine writing '<V2') gives
    got, _ = read_dump(tmp_path)
    assert np.array_equal(got["x"], vals)


def test_position_patterns():
    from workbench.diff.metrics import position_pattern, position_profile, token_axis
    assert "grows" in position_pattern(np.linspace(0, 1, 16) ** 2)
    assert "starts at position 5" in position_pattern(np.r_[np.zeros(5), np.ones(11) + 0.1 * rng.random(11)])
    assert "position 3 alone" in position_pattern(np.r_[np.zeros(3), 1.0, np.zeros(12)])
    assert position_pattern(1 + 0.1 * rng.random(16)) is None  # error everywhere alike: no shape to name
    assert position_pattern(np.zeros(16)) is None
    assert token_axis((1, 7, 64), 7) == 1 and token_axis((1, 4, 7, 7), 7) == 2 and token_axis((7, 64), 7) == 0
    r = rng.normal(size=(1, 3, 7, 4)).astype(np.float32)
    e = r.copy()
    e[0, :, 5] += 1.0
    prof = position_profile(r, e, 7)
    assert np.argmax(prof) == 5 and np.count_nonzero(prof) == 1


def test_verdicts():
    ref = _reference()
    eng = {k: v.copy() for k, v in ref.items()}
    eng["layers.0"] = eng["layers.0"] * 2  # over tolerance at op 4
    r = compare_arrays(ref, eng)
    assert r.verdict() is None  # no local errors known: nothing more to say
    ops = {o.op: o for o in r.ops}
    for o in r.ops:
        o.local_nmse, o.local_cosine, o.local_diverged = 1e-7, 1.0, False
    assert "no single op is wrong on its own" in r.verdict() and "--noise-floor" in r.verdict()
    ops["layers.0.self_attn.q_proj"].local_nmse, ops["layers.0.self_attn.q_proj"].local_diverged = 5e-3, True
    assert "the op that is itself wrong is layers.0.self_attn.q_proj" in r.verdict()  # earlier than op 4
    ops["layers.0"].local_nmse, ops["layers.0"].local_diverged = 0.5, True
    assert r.verdict().startswith("layers.0 is computed differently")
    assert r.found


# ---------------------------------------------------------------- non-finite values

def test_nonfinite_metrics_are_nan_with_the_finite_part_beside():
    r = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    for e, side in ((np.array([1.0, -2.0, np.nan, 0.5], np.float32), "nonfinite_new"),):
        m = error_metrics(r, e)
        assert all(np.isnan(m[k]) for k in ("cosine", "nmse", "max_abs", "max_rel"))
        assert m[side] == 1 and m["nonfinite"] == 1
        assert m["finite"]["cosine"] == pytest.approx(1.0) and m["finite"]["elements"] == 3
    # the reference side, and both sides, count too (and are reasons to diverge)
    m = error_metrics(np.array([np.inf, 1.0, np.nan], np.float32), np.array([0.0, 1.0, np.nan], np.float32))
    assert m["nonfinite_ref_only"] == 1 and m["nonfinite_both"] == 1 and m["nonfinite_new"] == 0
    from workbench.diff.metrics import diverged
    why = diverged(m, Tolerance())
    assert any("non-finite in the reference" in w for w in why) and any("in both" in w for w in why)


def test_nonfinite_where_tokens_channels_and_tile_shape():
    from workbench.diff.metrics import describe_nonfinite, nonfinite_where
    ref = rng.normal(size=(1, 9, 16)).astype(np.float32)
    eng = ref.copy()
    eng[0, 4:7, 8:16] = np.nan  # one block: tile-shaped
    w = nonfinite_where(ref, eng, tokens=9)
    assert w["count"] == 24 and w["engine"] == 24 and w["reference"] == 0
    assert w["rows"] == [[4, 6]] and w["channels"] == [[8, 15]] and w["tile"] and w["axis"] == "token"
    assert w["per_row"] == [0, 0, 0, 0, 8, 8, 8, 0, 0]
    assert "tokens 4-6 (3 of 9) x channels 8-15 (8 of 16)" in describe_nonfinite(w)
    assert "workbench hazards" in describe_nonfinite(w)
    # scattered values (an overflow here and there) are not a block: no hazards hint
    eng = ref.copy()
    for t, c in ((0, 1), (2, 9), (5, 3), (7, 14), (8, 6), (3, 11)):
        eng[0, t, c] = np.inf
    w = nonfinite_where(ref, eng, tokens=9)
    assert not w["tile"] and "hazards" not in describe_nonfinite(w)
    # heads-first [1, H, T, D]: tokens found on axis 2, channels are h * D + d
    ref4 = rng.normal(size=(1, 2, 9, 4)).astype(np.float32)
    eng4 = ref4.copy()
    eng4[0, 1, 3, :] = np.nan
    w = nonfinite_where(ref4, eng4, tokens=9)
    assert w["rows"] == [[3, 3]] and w["channels"] == [[4, 7]]
    assert nonfinite_where(ref, ref, tokens=9) is None


def test_report_with_nan_is_strict_json_and_never_clean():
    ref = _reference()
    eng = {k: v.copy() for k, v in ref.items()}
    eng["layers.0"][0, 1:3, :] = np.nan
    r = compare_arrays(ref, eng, tokens=T)
    o = r["layers.0"]
    assert r.first_divergence is o and np.isnan(o.cosine) and np.isnan(o.position_error[1:3]).all()
    d = r.to_dict()
    json.dumps(d, allow_nan=False)
    row = next(x for x in d["ops"] if x["op"] == "layers.0")
    assert row["cosine"] is None and row["nmse"] is None and row["nonfinite"]["count"] == 2 * H * D
    assert row["position_error"][1:3] == [None, None]
    # the reference NaN where the engine is finite: a divergence as well
    ref2 = {k: v.copy() for k, v in ref.items()}
    ref2["norm"][0, 0, 0] = np.nan
    r2 = compare_arrays(ref2, {k: v.copy() for k, v in ref.items()})
    assert r2.first_divergence.op == "norm" and "non-finite in the reference" in r2.first_divergence.reasons[0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), True, "0.9"])
def test_tolerance_must_be_finite_numbers(bad):
    with pytest.raises(ValueError, match="must be a finite number"):
        Tolerance(min_cosine=bad)
    with pytest.raises(ValueError, match="max_nmse"):
        Tolerance.from_any({"max_nmse": bad})
    assert Tolerance(max_abs=None, mask_below=None).max_abs is None


# ---------------------------------------------------------------- the shape of non-finite values

def _where(eng, ref=None, tokens=None):
    from workbench.diff.metrics import describe_nonfinite, nonfinite_where
    ref = np.ones_like(eng) if ref is None else ref
    w = nonfinite_where(ref, eng, tokens=tokens)
    return w, describe_nonfinite(w)


def _causal_scores(h=4, t=12):
    """[1, H, T, T] scores with the causal mask filled with bfloat16's lowest, as engines write it."""
    s = rng.normal(size=(1, h, t, t)).astype(np.float32)
    s[:, :, np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] = -3.3895314e38
    return s


def test_whole_op_nonfinite_is_everywhere_not_hazards():
    """An all-NaN op (a NaN weight or constant, or NaN inputs) is one block by extent, but it
    says nothing about memory: named 'everywhere', no hazards pointer."""
    w, line = _where(np.full((1, 6, 16), np.nan, np.float32), tokens=6)
    assert w["pattern"] == "everywhere" and w["tile"] is False
    assert "hazards" not in line and "inspect --values" in line and "everywhere" in line
    # scores: NaN wherever a number belongs, the mask fill kept -> still everywhere
    ref = _causal_scores()
    eng = np.where(ref < -1e30, ref, np.nan).astype(np.float32)
    w, line = _where(eng, ref, tokens=12)
    assert w["pattern"] == "everywhere" and not w["tile"] and w["count"] == 4 * 78
    # and through compare_arrays: the first divergence names it, with no hazards hint
    r = _reference()
    e = {k: v.copy() for k, v in r.items()}
    e["layers.0.self_attn.q_proj"][:] = np.nan
    fd = compare_arrays(r, e, tokens=T).first_divergence
    assert fd.op == "layers.0.self_attn.q_proj" and fd.nonfinite["pattern"] == "everywhere"
    assert not any("hazards" in x for x in fd.reasons)


def test_same_channels_at_every_token_is_a_weight_row_not_hazards():
    eng = np.ones((1, 6, 16), np.float32)
    eng[..., 5] = np.nan  # one NaN weight row of a projection: its output channel, at every token
    eng[..., 9:11] = np.inf
    w, line = _where(eng, tokens=6)
    assert w["pattern"] == "columns" and not w["tile"] and "hazards" not in line and "weight row" in line
    # one head's whole (causal) score map: the same, with the mask left out
    ref = _causal_scores()
    eng = ref.copy()
    eng[0, 2][ref[0, 2] > -1e30] = np.nan
    w, _ = _where(eng, ref, tokens=12)
    assert w["pattern"] == "columns" and not w["tile"]


def test_scattered_elements_are_overflow_not_hazards():
    eng = np.ones((1, 9, 16), np.float32)
    for t, c in ((0, 1), (2, 9), (5, 3), (7, 14), (8, 6), (3, 11)):
        eng[0, t, c] = np.inf
    eng[0, 4:7, 2] = np.nan  # a few tokens of one outlier channel: still no two side by side
    w, line = _where(eng, tokens=9)
    assert w["pattern"] == "scattered" and not w["tile"] and "hazards" not in line and "overflow" in line
    w, _ = _where(np.array([1.0, np.nan, 1.0, 1.0, np.nan], np.float32))  # two lone elements, 1-D
    assert w["pattern"] == "scattered" and not w["tile"]


def test_blocks_point_to_hazards():
    eng = np.ones((1, 14, 128), np.float32)
    eng[0, 7:] = np.nan  # the second half of a buffer never written: whole token rows
    w, line = _where(eng, tokens=14)
    assert w["pattern"] == "block" and w["tile"] and "workbench hazards" in line
    eng = np.ones((1, 16, 64), np.float32)
    eng[0, 2:5, 8:12] = np.nan
    eng[0, 9:11, 40:50] = np.nan
    w, line = _where(eng, tokens=16)
    assert w["pattern"] == "block" and w["tile"] and "2 contiguous token x channel block(s)" in line


def test_staircase_points_to_hazards():
    """The keys eaten while the score kernel reads them (notebook 10): per (head, query) a
    prefix of the keys, growing from query to query; the mask fill stays as it is."""
    ref = _causal_scores()
    eng = ref.copy()
    for h in range(4):
        for t in range(12):
            n = min(t + 1, (t * (h + 1)) // 3)  # at most the t + 1 visible keys
            eng[0, h, t, :n] = np.nan
    eng[0, 1, 5, 0] = np.inf  # an infinity among them is still non-finite
    w, line = _where(eng, ref, tokens=12)
    assert w["pattern"] == "staircase" and w["tile"]
    assert "leading channels that grows" in line and "workbench hazards" in line
    # shrinking trailing runs in a plain [T, D] activation
    eng = np.ones((1, 8, 32), np.float32)
    for t in range(8):
        eng[0, t, 32 - (16 - 2 * t):] = np.nan
    w, line = _where(eng, tokens=8)
    assert w["pattern"] == "staircase" and "trailing channels that shrinks" in line
    # prefixes that go up and down are no staircase (and not a few blocks either)
    eng = np.ones((1, 8, 32), np.float32)
    for t, n in enumerate((2, 9, 3, 12, 4, 7, 2, 10)):
        eng[0, t, :n] = np.nan
    w, _ = _where(eng, tokens=8)
    assert w["pattern"] not in ("staircase", "block")


def test_power_of_two_tiles_point_to_hazards():
    eng = np.ones((1, 32, 64), np.float32)
    for r0, c0 in ((0, 8), (8, 40), (16, 0), (16, 56), (24, 24), (8, 16)):
        eng[0, r0:r0 + 8, c0:c0 + 8] = np.nan  # six 8 x 8 tiles of a tiled kernel
    w, line = _where(eng, tokens=32)
    assert w["pattern"] == "tiles" and w["tile"] and "8 x 8 tiles" in line and "workbench hazards" in line
    # the same number of rectangles off any power-of-two grid: irregular, no pointer
    eng = np.ones((1, 32, 64), np.float32)
    for r0, c0 in ((0, 3), (5, 40), (13, 1), (17, 51), (24, 22), (9, 17)):
        eng[0, r0:r0 + 3, c0:c0 + 5] = np.nan
    w, line = _where(eng, tokens=32)
    assert w["pattern"] == "irregular" and not w["tile"] and "hazards" not in line


def test_nonfinite_pattern_in_json_and_text():
    r = _reference()
    e = {k: v.copy() for k, v in r.items()}
    e["layers.0"][0, 1:3, 4:8] = np.nan
    rep = compare_arrays(r, e, tokens=T)
    d = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    nf = d["first_divergence"]["nonfinite"]
    assert nf["pattern"] == "block" and nf["tile"] is True and "hazards" in nf["pattern_text"]
    assert "where: 8 non-finite element(s)" in rep.summary() and "; block: " in rep.summary()


# ---------------------------------------------------------------- huge finite values

def test_values_near_float32_max_give_finite_metrics_and_no_warning():
    import warnings

    top = np.finfo(np.float32).max
    ref = np.array([3.0e38, -3.2e38, 1.0, 2.0, top, 5.0], np.float32)
    eng = np.array([3.0e38, -3.2e38, 1.0, 2.5, top, -3.3e38], np.float32)  # a sign flipped at the end
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning (overflow, invalid) fails the test
        same = error_metrics(ref, ref.copy(), mask_below=None)
        m = error_metrics(ref, eng, mask_below=None)
    assert same["cosine"] == 1.0 and same["nmse"] == 0.0 and same["max_abs"] == 0.0 and same["max_rel"] == 0.0
    assert m["nonfinite"] == 0 and m["finite"] is None
    for k in ("cosine", "nmse", "max_abs", "max_rel", "nmse_power"):
        assert np.isfinite(m[k]), k
    r64, e64 = ref.astype(np.float64), eng.astype(np.float64)
    cos = r64 @ e64 / np.linalg.norm(r64) / np.linalg.norm(e64)
    assert m["cosine"] == pytest.approx(cos, rel=1e-12)
    assert m["nmse"] == pytest.approx(np.mean((e64 - r64) ** 2) / np.var(r64), rel=1e-12)
    assert m["max_abs"] == pytest.approx(3.3e38 + 5.0, rel=1e-6)


def test_probabilities_times_mask_fill_diverge_with_finite_metrics():
    """A stale read of scores as values (notebook 10, exercise 3): finite numbers near -3.4e38
    where the reference is O(1); the op diverges on its metrics, every one a number."""
    import warnings

    r = _reference()
    e = {k: v.copy() for k, v in r.items()}
    e["layers.0"][0, 2:, :] = rng.uniform(0, 1, size=(T - 2, H * D)).astype(np.float32) * np.float32(-3.3895314e38)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = compare_arrays(r, e, tokens=T)
        text = rep.summary()
    fd = rep.first_divergence
    assert fd.op == "layers.0" and fd.nonfinite is None
    assert np.isfinite(fd.cosine) and abs(fd.cosine) < 0.5 and np.isfinite(fd.nmse) and fd.nmse > 1e70
    assert any(x.startswith("cosine") for x in fd.reasons) and "nan" not in text.split("\n")[0]
    assert np.isfinite(fd.position_error).all()


# ---------------------------------------------------------------- --map rules, end to end

MAP_RULES = [[r"^blk\.(\d+)\.out$", "layers.$1"], [r"^tok_embd$", "embed_tokens"], [r"^out_norm$", "norm"]]


def _mapped_pair():
    ref = {n: rng.normal(size=(1, T, 12)).astype(np.float32) for n in ("embed_tokens", "layers.0", "layers.1", "norm")}
    eng = {"tok_embd": ref["embed_tokens"], "blk.0.out": ref["layers.0"], "blk.1.out": ref["layers.1"] * -1.0,
           "out_norm": ref["norm"]}
    return ref, eng


def test_compare_arrays_takes_rules_in_every_form():
    import re

    from workbench.patterns import UserRegex
    ref, eng = _mapped_pair()
    compiled = compile_rules(MAP_RULES)
    assert all(isinstance(rx, UserRegex) for rx, _ in compiled)  # the time-bounded form naming makes
    forms = {"pairs": MAP_RULES, "compiled": compiled, "compiled as lists": [list(x) for x in compiled],
             "an iterator": iter(MAP_RULES), "a generator of compiled": (x for x in compiled),
             "re.Pattern": [(re.compile(p.replace("$1", "")), rep) for p, rep in MAP_RULES]}
    forms["re.Pattern"][0] = (re.compile(r"^blk\.(\d+)\.out$"), r"layers.\1")
    for what, rules in forms.items():
        r = compare_arrays(ref, eng, rules=rules)
        assert r.compared == 4 and not r.unmatched_engine, what
        assert r.first_divergence.op == "layers.1" and r.renamed["blk.1.out"] == "layers.1", what
    with pytest.raises(RulesError, match="rule 0: a compiled regex with flags"):
        compare_arrays(ref, eng, rules=[(re.compile("^BLK", re.I), "x")])
    with pytest.raises(RulesError, match="pair of strings"):
        compare_arrays(ref, eng, rules=[[1, "x"]])


def test_diff_map_rules_file_end_to_end(tmp_path, capsys):
    from workbench.cli import main
    from workbench.diff import compare
    ref, eng = _mapped_pair()
    write_dump(tmp_path / "ref.safetensors", ref, list(ref), {"workbench.ids": json.dumps(list(range(1, T + 1)))})
    np.savez(tmp_path / "eng.npz", **eng)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(MAP_RULES))
    report = compare(tmp_path / "ref.safetensors", tmp_path / "eng.npz", rules=rules)
    assert report.compared == 4 and report.first_divergence.op == "layers.1" and not report.unmatched_engine
    assert compare(tmp_path / "ref.safetensors", tmp_path / "eng.npz", rules=MAP_RULES).compared == 4
    rc = main(["diff", str(tmp_path / "ref.safetensors"), str(tmp_path / "eng.npz"), "--map", str(rules), "--json"])
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert rc == 1 and captured.err == ""
    assert d["compared"] == 4 and d["first_divergence"]["op"] == "layers.1" and d["unmatched_engine"] == []
    assert d["renamed"] == {"tok_embd": "embed_tokens", "blk.0.out": "layers.0", "blk.1.out": "layers.1",
                            "out_norm": "norm"}
    # without the rules: the names matched by value (issue 42), the same finding, and said
    rc = main(["diff", str(tmp_path / "ref.safetensors"), str(tmp_path / "eng.npz"), "--json"])
    auto = json.loads(capsys.readouterr().out)
    assert rc == 1 and auto["first_divergence"]["op"] == "layers.1" and auto["renamed"] == d["renamed"]
    assert auto["automap"]["reason"].startswith("the engine's names matched 0 of its 4 tensors")
    assert [r"^blk\.(\d+)\.out$", r"layers.\1"] in auto["automap"]["rules"]
    # with the names as they are (an empty map) nothing maps: one line, exit 2, naming the fix
    (tmp_path / "none.json").write_text("[]")
    rc = main(["diff", str(tmp_path / "ref.safetensors"), str(tmp_path / "eng.npz"), "--map", str(tmp_path / "none.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "--map" in err and len(err.strip().splitlines()) == 1


def test_an_engine_tensor_matching_no_op_that_holds_nan_is_a_finding_not_a_clean():
    """An engine's NaN / +Inf in a tensor no op of ours matches (a private buffer, a name the
    rules missed) is said and exits 1; -Inf alone (an attention mask's fill) and the NaN
    placeholders of a partly printed dump are not."""
    rng = np.random.default_rng(0)
    ref = {"embed_tokens": rng.standard_normal((4, 8)).astype(np.float32)}
    eng = dict(ref, scratch=np.array([1.0, np.nan, np.inf, 2.0], np.float32))
    r = compare_arrays(ref, eng)
    assert r.first_divergence is None and r.found and r.outcome == "divergence" and not r.clean
    assert r.unmatched_nonfinite == {"scratch": [2, 4]} and r.to_dict()["unmatched_nonfinite"] == {"scratch": [2, 4]}
    assert "scratch holds 2 NaN / +Inf values (of 4) and matched no op" in r.verdict()
    assert "scratch (2 NaN / +Inf)" in r.summary()
    mask = dict(ref, kq_mask=np.array([0.0, -np.inf, -np.inf, 0.0], np.float32))
    assert compare_arrays(ref, mask).clean
    printed = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)  # (NaN where the dump printed nothing)
    partial = compare_arrays(ref, dict(ref, corner=printed), known={"corner": ~np.isnan(printed)})
    assert partial.unmatched_nonfinite == {} and partial.clean
