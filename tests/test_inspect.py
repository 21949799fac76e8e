"""`workbench inspect`: every problem code provoked from a zoo checkpoint and found; clean
checkpoints give no error; --values statistics are exact; JSON / exit codes / --diff."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.checkpoint import CheckpointError, open_checkpoint
from workbench.checkpoint.inspect import CODES
from workbench.cli import main

import mlx.core as mx  # noqa: E402

KEYS = {"ok", "model_type", "num_layers", "components", "quantization", "moe", "problems", "tensors"}
PKEYS = {"code", "severity", "message", "tensor", "file", "layer", "suggestion"}

CLEAN = [(a, q) for a in zoo.ARCHS + zoo.INSPECT_ONLY_ARCHS for q in zoo.QUANTS]


@pytest.mark.parametrize("arch,quant", CLEAN, ids=[f"{a}-{q}" for a, q in CLEAN])
def test_clean_checkpoints_have_no_problems(tmp_path, arch, quant):
    p = zoo.build(arch, tmp_path / "ck", quant=quant, shards=2 if quant in (None, "mxfp4") else 1)
    r = workbench.inspect(p, values=True, progress=False)
    if arch in zoo.INSPECT_ONLY_ARCHS:
        # the stand-in towers: workbench.load opens Gemma 3n with mlx-vlm, which cannot load them, and
        # inspect never vouches for what load refuses; the language model is clean
        assert [(x.code, x.tensor) for x in r.problems] == \
            [("missing-tensor", "vision_tower.timm_model.blocks.0.0.conv_exp.weight")], [x.message for x in r.problems]
        assert "mlx-vlm's gemma3n" in r.problems[0].message and not r.ok
        with pytest.raises(ValueError, match="vision_tower.timm_model"):
            workbench.load(p)
    else:
        assert r.ok and r.problems == [], [x.message for x in r.problems]
    assert r.model_type == {"gemma4": "gemma4_text", "gemma4_moe": "gemma4_text", "gemma4_kv": "gemma4_text",
                            "gemma3": "gemma3_text"}.get(arch, arch)
    if arch == "gemma3n":
        assert r.components == {"language_model": len(r.tensors) - 23, "vision_tower": 11, "embed_vision": 1,
                                "audio_tower": 10, "embed_audio": 1}
    d = r.to_dict()
    assert set(d) == KEYS
    assert d["num_layers"] == open_checkpoint(p).text_config["num_hidden_layers"]
    assert all(t["stats"] and t["stats"]["nan"] == 0 for t in d["tensors"])
    json.dumps(d, allow_nan=False)
    if quant:
        mode = zoo.QUANT_SPECS[quant][0]
        assert d["quantization"]["mode"] == mode and d["quantization"]["quantized_modules"] > 0


@pytest.mark.parametrize("arch", ["gemma4", "gemma4_moe", "llama"])
def test_clean_hf_layout(tmp_path, arch):
    p = zoo.build(arch, tmp_path / "ck", layout="hf", shards=2)
    r = workbench.inspect(p, progress=False)
    assert r.ok and not r.problems, [x.message for x in r.problems]
    if arch == "gemma4_moe":
        assert r.moe["layout"].startswith("fused gate_up_proj")
        assert r.moe["num_experts"] == 4 and r.moe["layers"] == 4


BROKEN = [(b, a, q) for b in zoo.BROKEN for a, q in (("gemma4_text", None), ("gemma4", "mxfp4"),
                                                       ("gemma4_moe", "nvfp4"), ("qwen3", "affine4"),
                                                       ("llama", None), ("gemma3", "affine8"),
                                                       ("gemma3n", "mxfp8"))]


@pytest.mark.parametrize("broken,arch,quant", BROKEN, ids=[f"{b}-{a}" for b, a, q in BROKEN])
def test_every_problem_code_is_found(tmp_path, broken, arch, quant):
    p = zoo.build(arch, tmp_path / "ck", quant=quant, broken=broken)
    r = workbench.inspect(p, values=(broken == "nonfinite-values"), progress=False)
    code = zoo.BROKEN[broken]
    # (Gemma 3n's stand-in towers are reported too -- test_clean_checkpoints_have_no_problems: left aside)
    hits = [x for x in r.problems if x.code == code and not (x.tensor or "").startswith("vision_tower.timm_model.")]
    assert hits, [x.message for x in r.problems]
    assert not r.ok
    for x in r.problems:
        assert x.code in CODES and x.severity in ("error", "warning")
        assert set(x.to_dict()) == PKEYS
    h = hits[0]
    files = {f.name for f in p.iterdir()}
    if code not in ("missing-tensor", "bad-config", "path-escape", "missing-shard"):
        assert h.file in files  # names the file as in the directory
    if code in ("missing-tensor", "unexpected-tensor", "shape-mismatch", "dtype-mismatch", "quantization-mismatch",
                "nonfinite-values", "index-mismatch"):
        assert h.layer == 1 and h.tensor and h.tensor in h.message
        prefix = {"gemma4": "language_model.model.", "gemma3": "language_model.model.",
                  "gemma3n": "model.language_model."}.get(arch, "model.")
        assert h.tensor.startswith(prefix)  # tensor names as in the checkpoint
    if code not in ("missing-tensor", "bad-config", "missing-shard", "path-escape"):
        assert "byte" in h.message or "offset" in h.message  # where: file and byte offset


def test_misnamed_is_told_from_missing(tmp_path):
    p = zoo.build("gemma4_text", tmp_path / "ck", broken="misnamed")
    r = workbench.inspect(p)
    (u,) = [x for x in r.problems if x.code == "unexpected-tensor"]
    (m,) = [x for x in r.problems if x.code == "missing-tensor"]
    assert u.tensor == "model.layers.1.mlp.down_prj.weight"
    assert u.suggestion == "model.layers.1.mlp.down_proj.weight"
    assert m.tensor == "model.layers.1.mlp.down_proj.weight" and m.suggestion == u.tensor
    p = zoo.build("gemma4_text", tmp_path / "ck2", broken="unexpected-tensor")
    (u,) = workbench.inspect(p).problems
    assert u.code == "unexpected-tensor" and u.suggestion is None  # nothing close: not a misnaming


def test_missing_tensor_counts_and_grid(tmp_path):
    p = zoo.build("qwen3", tmp_path / "ck", quant="affine4", broken="missing-tensor")
    r = workbench.inspect(p)
    miss = [x for x in r.problems if x.code == "missing-tensor"]
    assert [x.tensor for x in miss] == ["model.layers.1.self_attn.q_proj.weight"]  # one module, reported once
    assert r.grid["rows"][1]["q"] == "missing" and r.grid["rows"][0]["q"] == "ok"
    text = r.render()
    assert "layer 1" in text and "✗" in text and "missing-tensor" in text


def test_kv_shared_layers_may_omit_kv(tmp_path):
    # gemma4_text zoo: layers 4, 5 are KV-shared; their k/v/k_norm are absent (MLX) or present (HF)
    for layout in ("mlx", "hf"):
        r = workbench.inspect(zoo.build("gemma4_text", tmp_path / layout, layout=layout))
        assert r.ok and not r.problems
        assert r.grid["rows"][4]["k"] == ("absent-ok" if layout == "mlx" else "ok")
    # but a non-shared layer without k_proj is incomplete
    p = zoo.build("gemma4_text", tmp_path / "x")
    cfg = json.loads((p / "config.json").read_text())
    cfg["num_kv_shared_layers"] = 1
    (p / "config.json").write_text(json.dumps(cfg))
    r = workbench.inspect(p)
    assert {x.tensor for x in r.problems if x.code == "missing-tensor"} == {
        "model.layers.4.self_attn.k_proj.weight", "model.layers.4.self_attn.v_proj.weight",
        "model.layers.4.self_attn.k_norm.weight"}
    # the double-wide MLP of layer 4 is now the wrong width for a non-shared layer
    assert any(x.code == "shape-mismatch" and "layers.4.mlp" in x.tensor for x in r.problems)


def test_router_override_checked(tmp_path):
    p = zoo.build("gemma4_moe", tmp_path / "ck", quant="mxfp4")
    cfg = json.loads((p / "config.json").read_text())
    for k in [k for k in cfg["quantization"] if k.endswith("router.proj")]:
        del cfg["quantization"][k]
    (p / "config.json").write_text(json.dumps(cfg))
    r = workbench.inspect(p)
    qm = [x for x in r.problems if x.code == "quantization-mismatch"]
    assert len(qm) == 4 and all("router.proj" in x.tensor and "affine 8-bit g64" in x.message for x in qm)


def test_values_statistics_are_exact(tmp_path):
    p = zoo.build("llama", tmp_path / "ck", quant="affine4", broken="nonfinite-values")
    r = workbench.inspect(p, values=True, progress=False, chunk_bytes=4096)
    ck = open_checkpoint(p)
    by = {t["name"]: t for t in r.tensors}
    # a float tensor with NaN / Inf
    name = "model.layers.1.post_attention_layernorm.weight"
    x = np.array(ck.load("layers.1.post_attention_layernorm.weight").astype(mx.float32))
    s = by[name]["stats"]
    assert (s["nan"], s["posinf"], s["neginf"]) == (2, 1, 1)
    f = x[np.isfinite(x)]
    assert s["min"] == pytest.approx(f.min()) and s["max"] == pytest.approx(f.max())
    assert s["mean"] == pytest.approx(f.mean(), rel=1e-5) and s["std"] == pytest.approx(f.std(), rel=1e-4)
    (nf,) = [x for x in r.problems if x.code == "nonfinite-values"]
    assert nf.tensor == name and "2 NaN, 1 +Inf, 1 -Inf" in nf.message
    # a quantized weight: statistics of the dequantized values, group by group, across chunks
    t = by["model.layers.0.mlp.down_proj.weight"]
    assert t["dequantized"] and t["quantization"] == {"mode": "affine", "bits": 4, "group_size": 64}
    w = mx.dequantize(ck.load("layers.0.mlp.down_proj.weight"), ck.load("layers.0.mlp.down_proj.scales"),
                      ck.load("layers.0.mlp.down_proj.biases"), group_size=64, bits=4)
    w = np.array(w.astype(mx.float32))
    s = t["stats"]
    assert s["count"] == w.size
    assert s["min"] == pytest.approx(w.min(), rel=1e-3) and s["max"] == pytest.approx(w.max(), rel=1e-3)
    assert s["std"] == pytest.approx(w.std(), rel=1e-3)
    assert s["zero_frac"] == pytest.approx((w == 0).mean(), abs=1e-6)
    # scales checked too
    sc = np.array(ck.load("layers.0.mlp.down_proj.scales").astype(mx.float32))
    s = by["model.layers.0.mlp.down_proj.scales"]["stats"]
    assert s["count"] == sc.size and s["absmax"] == pytest.approx(np.abs(sc).max())


def test_values_counts_are_per_element(tmp_path):
    # +Inf and -Inf in one tensor: a sum would give NaN; counts must still be exact
    from workbench.checkpoint.values import Stats

    st = Stats()
    a = np.array([np.inf, -np.inf, np.inf, np.nan, 0.0, 1.0, -2.0], np.float32)
    st.add(a[:3])
    st.add(a[3:])
    d = st.to_dict()
    assert (d["nan"], d["posinf"], d["neginf"], d["count"]) == (1, 2, 1, 7)
    assert d["min"] == -2.0 and d["max"] == 1.0 and d["zero_frac"] == pytest.approx(1 / 7)


def test_mx_scales_decoded(tmp_path):
    p = zoo.build("qwen3", tmp_path / "ck", quant="mxfp4")
    r = workbench.inspect(p, values=True, progress=False)
    s = {t["name"]: t for t in r.tensors}["model.layers.0.mlp.up_proj.scales"]["stats"]
    assert 1e-4 < s["min"] <= s["max"] < 1  # E8M0 decoded to powers of two, not raw exponents
    assert np.log2(s["max"]) == int(np.log2(s["max"]))


def test_json_and_exit_codes(tmp_path, capsys):
    good = zoo.build("gemma3", tmp_path / "good", quant="mxfp8")
    assert main(["inspect", str(good), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) == KEYS and d["ok"] is True and d["tensors"] == []
    assert d["components"] == {"language_model": 123, "vision_tower": 15, "multi_modal_projector": 2}
    assert main(["inspect", str(good), "--json", "--tensors"]) == 0
    d = json.loads(capsys.readouterr().out)
    t = {x["name"]: x for x in d["tensors"]}["language_model.model.layers.0.self_attn.q_proj.weight"]
    assert t["canonical"] == "layers.0.self_attn.q_proj.weight" and t["dtype"] == "U32"
    assert t["file"] == "model.safetensors" and t["offset"] > 8
    bad = zoo.build("gemma3", tmp_path / "bad", broken="missing-tensor")
    assert main(["inspect", str(bad), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False and d["problems"][0]["code"] == "missing-tensor"
    assert main(["inspect", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "missing-tensor" in out and "FAILED" in out
    # unusable: one line on stderr, exit 2
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file or directory" in err[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inspect", str(empty), "--json"]) == 2
    cap = capsys.readouterr()
    assert "no .safetensors" in json.loads(cap.out)["error"]
    (tmp_path / "x.bin").write_bytes(b"abc")
    assert main(["inspect", str(tmp_path / "x.bin")]) == 2


def test_cli_subprocess_no_traceback(tmp_path):
    p = zoo.build("llama", tmp_path / "ck", broken="header-too-large")
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "inspect", str(p)], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert "exceeds the 100 MB" in r.stdout and "model.safetensors" in r.stdout


def test_single_file(tmp_path):
    p = zoo.build("qwen3", tmp_path / "ck", shards=2)
    f = p / "model-00001-of-00002.safetensors"
    ck = open_checkpoint(f)
    assert ck.files == ["model-00001-of-00002.safetensors"]
    r = workbench.inspect(f)
    assert any(x.code == "missing-tensor" for x in r.problems)  # half the model lives in the other shard
    lone = tmp_path / "lone"
    lone.mkdir()
    os.link(p / "model-00001-of-00002.safetensors", lone / "w.safetensors")
    r = workbench.inspect(lone / "w.safetensors")
    # no config.json: the headers are checked, but workbench.load cannot build a model from the file,
    # so inspect does not vouch for it
    assert not r.ok and [(x.code, x.severity) for x in r.problems] == [("bad-config", "error")]
    assert "no config.json" in r.problems[0].message and "workbench.load" in r.problems[0].message
    with pytest.raises(ValueError):
        workbench.load(lone / "w.safetensors")


def test_lazy_load_reads_nothing_at_open(tmp_path, monkeypatch):
    p = zoo.build("gemma4_text", tmp_path / "ck", quant="affine4")
    import workbench.checkpoint.sfile as sfile_mod

    reads = []
    real = sfile_mod.open_regular  # (the reader opens shards through workbench.fsio.open_regular)

    def spy(f, *a, **k):
        fh = real(f, *a, **k)
        if str(f).endswith(".safetensors"):
            orig = fh.read
            fh.read = lambda n=-1: (reads.append(n), orig(n))[1]
        return fh

    monkeypatch.setattr(sfile_mod, "open_regular", spy)
    ck = open_checkpoint(p)
    assert max(reads) < 20000  # the 8-byte length and the header, nothing else
    arr = ck.load("layers.0.self_attn.q_proj.weight")
    assert arr.shape == (64, 8) and arr.dtype == mx.uint32


def test_load_errors_name_file_and_offset(tmp_path):
    p = zoo.build("llama", tmp_path / "ck", broken="truncated-file")
    ck = open_checkpoint(p)
    cut = sorted(ck.sfiles["model.safetensors"].truncated)
    assert "lm_head.weight" in cut
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'lm_head\.weight' at byte \d+"):
        ck.load("lm_head.weight")
    ck.load("layers.0.self_attn.q_proj.weight")  # intact tensors still load


def test_diff(tmp_path, capsys):
    a = zoo.build("qwen3", tmp_path / "a")
    b = zoo.build("qwen3", tmp_path / "b", layout="hf")
    assert main(["inspect", str(a), "--diff", str(b)]) == 0  # same weights, same canonical names
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("  headers match")
    c = zoo.build("qwen3", tmp_path / "c", seed=1, broken="misnamed")
    assert main(["inspect", str(a), "--diff", str(c), "--values", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["only_a"] == ["layers.1.mlp.down_proj.weight"] and d["only_b"] == ["layers.1.mlp.down_prj.weight"]
    assert any(v["tensor"] == "layers.0.self_attn.q_proj.weight" for v in d["values"])
    e = zoo.build("qwen3", tmp_path / "e", quant="affine8")
    capsys.readouterr()
    assert main(["inspect", str(a), "--diff", str(e)]) == 1
    out = capsys.readouterr().out
    assert "dtype differs" in out and "only in b" in out  # .scales/.biases


def test_diff_hf_vs_mlx_moe_is_same(tmp_path):
    from workbench.checkpoint.inspect import diff

    a = zoo.build("gemma4_moe", tmp_path / "hf", layout="hf", shards=2, dtype="float32")
    b = zoo.build("gemma4_moe", tmp_path / "mlx", dtype="float32")
    d = diff(a, b, values=True, progress=False)
    assert d["same"], d  # fused gate_up_proj compared half by half with switch_glu.gate/up_proj
    c = zoo.build("gemma4_moe", tmp_path / "q", quant="mxfp4")
    d = diff(b, c)
    assert not d["same"]
    q = {x["tensor"]: x for x in d["quantization"]}
    assert q["layers.0.router.proj.weight"]["b"] == {"mode": "affine", "bits": 8, "group_size": 64}


@pytest.mark.parametrize("case", ["normal", "negative", "positive", "zeros", "signed-zero", "nonfinite", "tiny"])
def test_bf16_fast_path_matches_exact(case):
    from workbench.checkpoint.values import Stats, _bf16_to_f32

    rng = np.random.default_rng(0)
    x = rng.standard_normal(5000).astype(np.float32)
    if case == "negative":
        x = -np.abs(x) - 0.5
    elif case == "positive":
        x = np.abs(x) + 3.0
    elif case == "zeros":
        x[::7] = 0
    elif case == "signed-zero":
        x = np.array([-0.0, 0.0, -0.0], np.float32)
    elif case == "nonfinite":
        x[[3, 9]] = np.inf
        x[5] = -np.inf
        x[100] = np.nan
    elif case == "tiny":
        x = x * 1e-30
    u = (x.view(np.uint32) >> 16).astype(np.uint16)
    fast, exact = Stats(), Stats()
    for part in np.array_split(u, 3):
        fast.add_bf16(part)
        exact.add(_bf16_to_f32(part).copy())
    a, b = fast.to_dict(), exact.to_dict()
    for k in ("nan", "posinf", "neginf", "count", "zero_frac", "min", "max", "absmax"):
        assert a[k] == b[k], k
    assert a["mean"] == pytest.approx(b["mean"], rel=1e-9, abs=1e-40)
    assert a["std"] == pytest.approx(b["std"], rel=1e-9, abs=1e-40)
    ref = _bf16_to_f32(u).astype(np.float64)
    fin = ref[np.isfinite(ref)]
    assert a["min"] == fin.min() and a["max"] == fin.max()
    assert a["mean"] == pytest.approx(fin.mean(), rel=1e-5, abs=1e-35)


def test_values_memory_is_bounded_by_chunks(tmp_path):
    import tracemalloc

    p = zoo.build("qwen3", tmp_path / "big", tokenizer=False, hidden_size=512, num_hidden_layers=4,
                  intermediate_size=2048, num_attention_heads=4, num_key_value_heads=4, head_dim=128,
                  vocab_size=8000)
    size = (p / "model.safetensors").stat().st_size
    assert size > 30e6
    tracemalloc.start()
    try:
        r = workbench.inspect(p, values=True, progress=False, chunk_bytes=1 << 18)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ok and len(r.tensors) == len(open_checkpoint(p).tensors)
    assert peak < 8e6, peak  # a few chunks in flight, not the 30+ MB checkpoint


def test_tower_layer_consistency(tmp_path):
    # towers have no architecture table: a layer lacking what the other layers hold is reported
    from workbench.zoo import write_safetensors

    d = tmp_path / "ck"
    p = zoo.build("gemma4", d)
    ck = open_checkpoint(p)
    extra = {}
    for i in range(4):
        for suf in ("lconv1d.linear_start.linear.weight", "lconv1d.norm.weight"):
            if (i, suf) != (2, "lconv1d.linear_start.linear.weight"):
                extra[f"audio_tower.layers.{i}.{suf}"] = ("BF16", (8, 8) if "linear" in suf else (8,),
                                                          bytes(128 if "linear" in suf else 16))
    write_safetensors(d / "model-audio.safetensors", extra)
    r = workbench.inspect(p)
    (w,) = [x for x in r.problems if x.tensor == "audio_tower.layers.2.lconv1d.linear_start.linear.weight"]
    assert w.code == "missing-tensor" and w.severity == "warning" and "3 of the 4 layers" in w.message
    assert r.ok  # a warning: the language model is complete
    assert len(r.problems) == 1, [x.message for x in r.problems]
    del ck


def test_unknown_family_still_checks_layer_consistency(tmp_path):
    p = zoo.build("qwen3", tmp_path / "ck", broken="missing-tensor")
    cfg = json.loads((p / "config.json").read_text())
    cfg["model_type"] = "qwen9"
    (p / "config.json").write_text(json.dumps(cfg))
    r = workbench.inspect(p)
    codes = {(x.code, x.severity) for x in r.problems}
    assert ("bad-config", "error") in codes and not r.ok  # nothing builds qwen9: never vouched for
    (m,) = [x for x in r.problems if x.code == "missing-tensor"]
    assert m.tensor == "model.layers.1.self_attn.q_proj.weight" and "2 of the 3 layers" in m.message


def test_values_with_affine_biases_missing(tmp_path):
    p = zoo.build("qwen3", tmp_path / "ck", quant="affine4")
    f = p / "model.safetensors"
    raw = f.read_bytes()
    old = b'"model.layers.0.mlp.up_proj.biases"'
    assert raw.count(old) == 1
    f.write_bytes(raw.replace(old, b'"model.layers.0.mlp.up_proj.biasez"'))  # same length: header stays sound
    r = workbench.inspect(p, values=True, progress=False)
    codes = {(x.code, x.tensor) for x in r.problems}
    assert ("quantization-mismatch", "model.layers.0.mlp.up_proj.weight") in codes
    assert ("unexpected-tensor", "model.layers.0.mlp.up_proj.biasez") in codes
    t = {x["name"]: x for x in r.tensors}["model.layers.0.mlp.up_proj.weight"]
    assert t["stats"] is not None and "dequantized" not in t  # raw packed words scanned instead


def test_progress_bar_on_a_terminal_only(tmp_path):
    import pty

    p = zoo.build("llama", tmp_path / "ck")
    cmd = [sys.executable, "-m", "workbench.cli", "inspect", str(p), "--values"]
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real terminal's size
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=slave, timeout=120)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(master)
    assert r.returncode == 0
    assert b"values" in err and b"%" in err  # tqdm drew a bar on the terminal
    r = subprocess.run(cmd, capture_output=True, timeout=120)  # not a terminal: no bar
    assert r.returncode == 0 and b"%" not in r.stderr


def test_python_api_equals_cli_json(tmp_path, capsys):
    p = zoo.build("gemma4", tmp_path / "ck", quant="mxfp4", broken="misnamed")
    r = workbench.inspect(p, values=True, progress=False)
    assert main(["inspect", str(p), "--values", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(r.to_dict()))
    assert not r.ok and r.problems and all(hasattr(x, "code") for x in r.problems)


@pytest.mark.parametrize("old,new,rule", [(b".layers.", b".blocks.", "'layers' -> 'blocks'"),
                                          (b'"model.', b'"xfmr.', "an extra leading 'xfmr.'")])
def test_systematic_renames_are_misnamed_not_missing(tmp_path, old, new, rule):
    import struct

    p = zoo.build("qwen3", tmp_path / "ck")
    f = p / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = raw[8: 8 + n].replace(old, new)
    h += b" " * ((8 - len(h) % 8) % 8)
    f.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    r = workbench.inspect(p)
    un = [x for x in r.problems if x.code == "unexpected-tensor"]
    miss = [x for x in r.problems if x.code == "missing-tensor"]
    assert len(un) >= 30 and len(miss) >= 30
    assert all(x.suggestion for x in un) and all(x.suggestion for x in miss)
    x = [u for u in un if u.tensor.endswith("1.self_attn.q_proj.weight")][0]
    assert x.suggestion.endswith("layers.1.self_attn.q_proj.weight") and "misnamed" in x.message
    assert any(rule in n and "misnamed, not missing" in n for n in r.notes)
    assert "misnamed, not missing" in r.render()


def test_readable_tensor_listing(tmp_path, capsys):
    p = zoo.build("llama", tmp_path / "ck", quant="affine8")
    assert main(["inspect", str(p), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "tensors (" in out and "model.layers.2.mlp.up_proj.weight  U32 [128, 16] affine 8-bit g64" in out
    assert main(["inspect", str(p), "--tensors", "--values", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "model.norm.weight  BF16 [64]" in out and "NaN 0 +Inf 0 -Inf 0" in out
