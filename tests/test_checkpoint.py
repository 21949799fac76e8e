"""The checkpoint reader: safetensors parsing (checked against the reference `safetensors`
library), name layouts, quantization inference."""
import json
import struct

import numpy as np
import pytest

import workbench  # noqa: F401
from workbench import zoo
from workbench.checkpoint import CheckpointError, QuantSpec, open_checkpoint
from workbench.checkpoint.names import canonical, split_name
from workbench.checkpoint.quant import QuantConfig, infer
from workbench.checkpoint.sfile import SafetensorsFile

import mlx.core as mx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402


def test_dtypes_match_reference_library(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((4,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2)),
        "i32": rng.integers(-100, 100, (7,)).astype(np.int32),
        "i64": rng.integers(-100, 100, (2, 3)).astype(np.int64),
        "u8": rng.integers(0, 255, (9,)).astype(np.uint8),
        "i8": rng.integers(-100, 100, (9,)).astype(np.int8),
        "u32": rng.integers(0, 2**31, (4, 2)).astype(np.uint32),
        "i16": rng.integers(-100, 100, (5,)).astype(np.int16),
        "bool": rng.integers(0, 2, (6,)).astype(bool),
        "scalar": np.array(3.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }
    d = tmp_path / "ck"
    d.mkdir()
    save_file(arrays, str(d / "model.safetensors"), metadata={"format": "np"})
    ref = load_file(str(d / "model.safetensors"))
    ck = open_checkpoint(d)
    assert not [p for p in ck.problems if p.code != "bad-config"]
    for k, v in ref.items():
        ti = ck.info(k)
        assert ti.shape == v.shape and ti.nbytes == v.nbytes
        got = np.array(ck.load(k))
        assert got.shape == v.shape and np.array_equal(got, v), k
    # offsets are absolute byte positions in the file
    raw = (d / "model.safetensors").read_bytes()
    ti = ck.info("f32")
    assert np.array_equal(np.frombuffer(raw[ti.offset: ti.offset + ti.nbytes], np.float32).reshape(3, 5),
                          arrays["f32"])


def test_bf16_matches_mlx(tmp_path):
    x = mx.random.normal((8, 16)).astype(mx.bfloat16)
    d = tmp_path / "ck"
    d.mkdir()
    mx.save_safetensors(str(d / "model.safetensors"), {"model.norm.weight": x})
    ck = open_checkpoint(d)
    assert ck.info("norm.weight").dtype == "BF16"
    assert mx.array_equal(ck.load("norm.weight"), x)
    # the numpy fallback path (used for files with header problems) gives the same bits
    sf = ck.sfiles["model.safetensors"]
    bits = sf.read_numpy("model.norm.weight")
    assert mx.array_equal(mx.array(bits).view(mx.bfloat16), x)


def _write_raw(path, header: dict | bytes, data: bytes = b"", length=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)


@pytest.mark.parametrize("header,data,expect", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "overlaps"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "gap of 4 bytes"),
    ({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "invalid shape"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "cut off"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], '
     b'"data_offsets": [0, 4]}}', b"\0" * 4, "appears twice"),
    (b"[1, 2]", b"", "not an object"),
    (b"\xff\xfe", b"", "not UTF-8"),
    (b"[" * 100000, b"", "cannot be parsed"),
], ids=["sound", "size", "overlap", "gap", "dtype", "shape", "truncated", "duplicate", "array", "utf8", "nesting"])
def test_header_problems(tmp_path, header, data, expect):
    p = tmp_path / "x.safetensors"
    _write_raw(p, header, data)
    f = SafetensorsFile.parse(str(p))
    msgs = [q["message"] for q in f.problems]
    if expect is None:
        assert msgs == [] and f.tensors["a"].shape == (2,)
    else:
        assert any(expect in m for m in msgs), msgs
        assert all(m.startswith("x.safetensors: ") for m in msgs)


def test_header_length_never_allocated(tmp_path):
    p = tmp_path / "x.safetensors"
    _write_raw(p, b"{}", length=2**63)
    f = SafetensorsFile.parse(str(p))
    assert "exceeds the 100 MB" in f.problems[0]["message"] and f.problems[0]["offset"] == 0
    _write_raw(p, b"{}", length=50_000_000)
    f = SafetensorsFile.parse(str(p))
    assert "runs past the end of the file" in f.problems[0]["message"]
    p.write_bytes(b"abc")
    assert "too short" in SafetensorsFile.parse(str(p)).problems[0]["message"]


@pytest.mark.parametrize("name,comp,canon", [
    ("language_model.model.layers.3.self_attn.q_proj.weight", "language_model", "layers.3.self_attn.q_proj.weight"),
    ("model.language_model.layers.3.mlp.up_proj.weight", "language_model", "layers.3.mlp.up_proj.weight"),
    ("model.layers.0.input_layernorm.weight", "language_model", "layers.0.input_layernorm.weight"),
    ("language_model.lm_head.weight", "language_model", "lm_head.weight"),
    ("lm_head.weight", "language_model", "lm_head.weight"),
    ("model.vision_tower.encoder.layers.0.x.weight", "vision_tower", None),
    ("vision_tower.vision_model.post_layernorm.weight", "vision_tower", None),
    ("model.audio_tower.layers.0.x.weight", "audio_tower", None),
    ("embed_vision.embedding_projection.weight", "embed_vision", None),
    ("model.embed_audio.embedding_projection.weight", "embed_audio", None),
    ("multi_modal_projector.mm_input_projection_weight", "multi_modal_projector", None),
])
def test_name_layouts(name, comp, canon):
    assert split_name(name)[0] == comp
    assert [c for c, _ in canonical(name)] == ([canon] if canon else [])


def test_fused_experts_split():
    assert canonical("model.language_model.layers.2.experts.gate_up_proj") == [
        ("layers.2.experts.switch_glu.gate_proj.weight", "gate"), ("layers.2.experts.switch_glu.up_proj.weight", "up")]
    assert canonical("model.layers.2.experts.down_proj") == [("layers.2.experts.switch_glu.down_proj.weight", None)]


@pytest.mark.parametrize("mode,bits,gs", [("affine", 2, 32), ("affine", 3, 64), ("affine", 4, 64), ("affine", 5, 32),
                                          ("affine", 6, 64), ("affine", 8, 128), ("mxfp4", 4, 32),
                                          ("mxfp8", 8, 32), ("nvfp4", 4, 16)])
def test_quant_inference_from_mx_quantize(mode, bits, gs):
    w = mx.random.normal((32, 256))
    r = mx.quantize(w, group_size=gs, bits=bits, mode=mode)
    sdt = "U8" if r[1].dtype == mx.uint8 else "F32"
    spec = QuantSpec(mode, bits, gs)
    assert infer(tuple(r[0].shape), tuple(r[1].shape), sdt, in_dim=256) == spec
    assert infer(tuple(r[0].shape), tuple(r[1].shape), sdt, hint=spec) == spec
    assert spec.packed_shape((32, 256)) == tuple(r[0].shape) and spec.scales_shape((32, 256)) == tuple(r[1].shape)


def test_quant_inference_rejects_impossible():
    assert infer((32, 10), (32, 3), "U8", in_dim=64) is None  # 10*32/64 = 5 bits with uint8 scales: no mode
    assert infer((32, 7), (32, 2), "F32", in_dim=64) is None  # 7*32 not a multiple of 64


def test_quant_config_overrides():
    qc = QuantConfig({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
                                       "language_model.model.layers.0.router.proj": {"group_size": 64, "bits": 8},
                                       "model.layers.1.mlp.down_proj": False}})
    assert qc.expected("layers.0.router.proj") == QuantSpec("affine", 8, 64)
    assert qc.expected("layers.1.mlp.down_proj") is None
    assert qc.expected("layers.0.mlp.down_proj") == QuantSpec("mxfp4", 4, 32)
    assert QuantConfig({}).present is False


def test_api_surface(tmp_path):
    p = zoo.build("gemma4", tmp_path / "g4", quant="affine4")
    ck = open_checkpoint(p)
    assert ck.config["model_type"] == "gemma4" and ck.text_config["model_type"] == "gemma4_text"
    assert ck.model_type == "gemma4_text" and ck.num_layers == 6
    assert ck.components == {"language_model": 193, "vision_tower": 11, "embed_vision": 1, "audio_tower": 10,
                             "embed_audio": 1}
    names = ck.lm_names()
    assert names == sorted(names) and "embed_tokens.weight" in names and "norm.weight" in names
    assert "layers.3.self_attn.q_proj.scales" in names and "layers.3.self_attn.q_proj.biases" in names
    ti = ck.info("layers.3.self_attn.q_proj.weight")
    assert (ti.dtype, ti.shape, ti.file) == ("U32", (64, 8), "model.safetensors")
    assert ti.source_name == "language_model.model.layers.3.self_attn.q_proj.weight"
    by_src = ck.info(ti.source_name)  # the name as stored works too
    assert (by_src.offset, by_src.file, by_src.shape) == (ti.offset, ti.file, ti.shape)
    assert ck.quant_of("layers.3.self_attn.q_proj") == QuantSpec("affine", 4, 64)
    assert ck.quant_of("layers.3.per_layer_projection") is None  # input width 16: kept float
    assert ck.tokenizer_path.name == "tokenizer.json"
    v = ck.load("vision_tower.encoder.layers.0.input_layernorm.weight")
    assert v.shape == (32,)
    with pytest.raises(KeyError):
        ck.info("layers.99.nothing")


def test_unusable_paths(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        open_checkpoint(tmp_path / "missing")
    (tmp_path / "e").mkdir()
    with pytest.raises(CheckpointError, match="no .safetensors"):
        open_checkpoint(tmp_path / "e")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory or a .safetensors file"):
        open_checkpoint(tmp_path / "f.txt")


def test_index_file_as_path(tmp_path):
    p = zoo.build("llama", tmp_path / "l", shards=2)
    ck = open_checkpoint(p / "model.safetensors.index.json")
    assert ck.path == p and len(ck.files) == 2 and not ck.problems


def test_fp8_decoded(tmp_path):
    from workbench.checkpoint.values import LUT

    u = np.arange(256, dtype=np.uint8)
    ref_e4m3 = np.array(mx.from_fp8(mx.array(u), dtype=mx.float32))  # MLX's E4M3
    ref_e5m2 = (u.astype(np.uint16) << 8).view(np.float16).astype(np.float32)  # E5M2 = float16's top byte
    for lut, ref in ((LUT["E4M3"], ref_e4m3), (LUT["E5M2"], ref_e5m2)):
        assert np.array_equal(np.isnan(lut), np.isnan(ref))
        assert np.array_equal(lut[~np.isnan(lut)], ref[~np.isnan(ref)])
    # a checkpoint holding FP8 tensors: load decodes, --values scans them
    d = tmp_path / "ck"
    d.mkdir()
    raw = u.tobytes()
    header = {"a": {"dtype": "F8_E4M3", "shape": [256], "data_offsets": [0, 256]},
              "b": {"dtype": "F8_E5M2", "shape": [16, 16], "data_offsets": [256, 512]}}
    _write_raw(d / "model.safetensors", header, raw + raw)
    ck = open_checkpoint(d)
    a = np.array(ck.load("a"))
    assert np.array_equal(a[~np.isnan(a)], ref_e4m3[~np.isnan(ref_e4m3)])
    assert ck.load("b").shape == (16, 16)
    r = workbench.inspect(d, values=True, progress=False)
    s = {t["name"]: t["stats"] for t in r.tensors}
    assert (s["a"]["nan"], s["a"]["posinf"]) == (2, 0) and s["a"]["max"] == 448.0
    assert (s["b"]["nan"], s["b"]["posinf"], s["b"]["neginf"]) == (6, 1, 1)
