"""`inspect` on architectures it has no hand-written table for: the expected tensors come from
the reference model class itself (workbench/checkpoint/reference_arch.py).

Tiny checkpoints are written by mlx-lm's own classes (workbench.zoo.reference); a removed
tensor must be reported missing, a renamed one misnamed, a wrong shape mis-shaped, and a
quantized checkpoint must inspect clean.  Real-size configs build their tensor list without
allocating.
"""
from __future__ import annotations

import gc
import importlib
import json
import math
import sys

import pytest
from memory import rss_mb

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

from workbench import registry
from workbench.checkpoint import arch as A
from workbench.checkpoint.inspect import inspect
from workbench.checkpoint.reference_arch import reference_tensors
from workbench.zoo import reference as zr

ALL = list(zr.ARCHS)
#: architectures with no hand-written table: their expected tensors are the reference's
REFERENCE_ONLY = [a for a in ALL if registry.table_family(zr.ARCHS[a]) is None]


def test_archs_cover_the_issue_list():
    for a in ("phi3", "mixtral", "starcoder2", "olmo2", "deepseek_v3", "qwen3_moe", "gpt_oss"):
        assert a in REFERENCE_ONLY
    assert "gemma3n" in ALL and "qwen2" in ALL


def test_one_registry():
    import workbench.models as M

    # one model-type list (registry.OP_FAMILIES): every family it names has a file, every file
    # is named, and load picks that file for each of its types
    assert set(registry.OP_FAMILIES.values()) == set(M.FAMILIES)
    assert all(M.FAMILIES[f].FAMILY == f for f in M.FAMILIES)
    assert all(M.family_of(t).FAMILY == f for t, f in registry.OP_FAMILIES.items())
    assert M.FAMILIES["llama"].MODEL_TYPES == ("llama", "mistral", "qwen2")
    with pytest.raises(ValueError, match="no model type maps to op family 'gemma3n'"):
        registry.model_types("gemma3n")
    assert A.FAMILIES is registry.TABLE_FAMILIES
    assert set(registry.OP_FAMILIES.items()) <= set(A.FAMILIES.items())
    assert A.family_of({"model_type": "qwen2"}) == "llama" == registry.op_family({"model_type": "qwen2"})
    assert A.family_of({"model_type": "phi3"}) is None
    assert A.build_arch(dict(zr.ARCHS["phi3"])).family == "phi3"


# ------------------------------------------------------------------ tiny checkpoints
def _rewrite(path, change):
    """Apply ``change(weights: dict)`` to the checkpoint's model.safetensors."""
    f = path / "model.safetensors"
    w = dict(mx.load(str(f)))
    change(w)
    f.unlink()
    mx.save_safetensors(str(f), w, metadata={"format": "mlx"})


def _layer1(w, pred):
    names = sorted(n for n in w if ".layers.1." in n and pred(n, w[n]))
    assert names, "no layer-1 tensor to break"
    return names[0]


def _errors(r):
    return [p for p in r.problems if p.severity == "error"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    cache = {}

    def get(arch, **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in cache:
            d = root / f"{arch}-{len(cache)}"
            cache[key] = zr.write(d, zr.ARCHS[arch], tokenizer=False, **kw)
        return cache[key]
    return get


def _copy(src, dest):
    dest.mkdir()
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.mark.parametrize("arch", ALL)
def test_clean_checkpoint_inspects_clean(arch, clean):
    r = inspect(clean(arch))
    assert r.ok and not r.problems, [p.message for p in r.problems]
    fam = registry.table_family(zr.ARCHS[arch])
    if fam is None:  # from the reference: named by its module, every tensor accounted for
        assert r.model_type == arch
    assert r.num_layers == 2


@pytest.mark.parametrize("arch", ALL)
def test_removed_tensor_is_missing(arch, clean, tmp_path):
    p = _copy(clean(arch), tmp_path / "ck")
    gone = []

    def drop(w):
        n = _layer1(w, lambda n, v: n.endswith(".weight") and v.ndim == 2)
        gone.append(n)
        del w[n]
    _rewrite(p, drop)
    r = inspect(p)
    errs = _errors(r)
    assert [(e.code, e.tensor) for e in errs] == [("missing-tensor", gone[0])], [e.message for e in errs]
    assert errs[0].layer == 1


@pytest.mark.parametrize("arch", ALL)
def test_renamed_tensor_is_misnamed(arch, clean, tmp_path):
    p = _copy(clean(arch), tmp_path / "ck")
    names = []

    def rename(w):
        n = _layer1(w, lambda n, v: ".self_attn." in n and n.endswith("proj.weight")) \
            if any(".self_attn." in k and k.endswith("proj.weight") for k in w) else \
            _layer1(w, lambda n, v: n.endswith("proj.weight"))
        mod = n.rsplit(".", 2)[1]
        new = n.replace(f".{mod}.weight", ".query.weight")
        names.extend([n, new])
        w[new] = w.pop(n)
    _rewrite(p, rename)
    r = inspect(p)
    old, new = names
    got = {(e.code, e.tensor): e for e in _errors(r)}
    assert set(got) == {("missing-tensor", old), ("unexpected-tensor", new)}, [e.message for e in _errors(r)]
    assert "misnamed" in got[("unexpected-tensor", new)].message
    assert got[("unexpected-tensor", new)].suggestion == old
    assert got[("missing-tensor", old)].suggestion == new


@pytest.mark.parametrize("arch", ALL)
def test_wrong_shape_is_mis_shaped(arch, clean, tmp_path):
    p = _copy(clean(arch), tmp_path / "ck")
    hit = []

    def cut(w):
        n = _layer1(w, lambda n, v: n.endswith(".weight") and v.ndim >= 2 and v.shape[0] > 1)
        hit.append((n, w[n].shape))
        w[n] = w[n][:-1]
    _rewrite(p, cut)
    r = inspect(p)
    errs = _errors(r)
    n, shape = hit[0]
    assert [(e.code, e.tensor) for e in errs] == [("shape-mismatch", n)], [e.message for e in errs]
    assert f"expected {list(shape)}" in errs[0].message


@pytest.mark.parametrize("arch", ALL)
def test_quantized_checkpoint_inspects_clean(arch, clean):
    p = clean(arch, quant="affine4")
    cfg = json.loads((p / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 4
    r = inspect(p)
    assert r.ok and not r.problems, [p_.message for p_ in r.problems]
    assert r.quantization["quantized_modules"] > 0
    # (a model's quant_predicate may keep some modules at other specs: config.json's overrides,
    # which inspect holds every packed weight to)
    assert "affine 4-bit g32" in r.quantization["specs"]
    assert sum(r.quantization["specs"].values()) == r.quantization["quantized_modules"]


@pytest.mark.parametrize("arch,width,layers", [("mixtral", 128, 2), ("deepseek_v3", 32, 1), ("gpt_oss", 64, 2)])
def test_moe_summary_from_the_reference(arch, width, layers, clean):
    r = inspect(clean(arch, quant="affine4"))
    m = r.moe
    assert (m["num_experts"], m["top_k"], m["moe_intermediate_size"], m["layers"]) == (4, 2, width, layers)
    assert m["expert_quantization"] == "affine 4-bit g32"
    assert "MoE: 4 experts, top-2" in r.render()


@pytest.mark.parametrize("arch", ["phi3", "mixtral", "deepseek_v3"])
def test_quantized_scales_removed_is_reported(arch, clean, tmp_path):
    p = _copy(clean(arch, quant="affine4"), tmp_path / "ck")
    hit = []

    def drop(w):
        n = _layer1(w, lambda n, v: n.endswith(".scales"))
        hit.append(n[: -len(".scales")] + ".weight")
        del w[n]
    _rewrite(p, drop)
    r = inspect(p)
    assert [(e.code, e.tensor) for e in _errors(r)] == [("quantization-mismatch", hit[0])]


def test_tied_lm_head_that_sanitize_drops_may_be_present(tmp_path):
    """qwen3_moe's sanitize drops an lm_head when the embeddings are tied: present, it is
    not unexpected; a model without that sanitize rule (starcoder2) reports it."""
    cfg = dict(zr.ARCHS["qwen3_moe"], tie_word_embeddings=True)
    p = zr.write(tmp_path / "q", cfg, tokenizer=False)
    assert inspect(p).ok
    _rewrite(p, lambda w: w.__setitem__("lm_head.weight", w["model.embed_tokens.weight"]))
    r = inspect(p)
    assert r.ok and not r.problems, [x.message for x in r.problems]
    cfg = dict(zr.ARCHS["starcoder2"], tie_word_embeddings=True)
    p = zr.write(tmp_path / "s", cfg, tokenizer=False)
    _rewrite(p, lambda w: w.__setitem__("lm_head.weight", w["model.embed_tokens.weight"]))
    r = inspect(p)
    assert [(e.code, e.tensor) for e in _errors(r)] == [("unexpected-tensor", "lm_head.weight")]


# ------------------------------------------------------------------ layouts the reference converts
def _to_hf_experts(w):
    """Mixtral's original Hugging Face layout: one w1 / w2 / w3 per expert, which mlx-lm's
    sanitize stacks into switch_mlp.{gate,down,up}_proj."""
    for k in [k for k in w if ".switch_mlp." in k]:
        v = w.pop(k)
        for hf, mlx in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
            if f".{mlx}." in k:
                for e in range(v.shape[0]):
                    w[k.replace(f"switch_mlp.{mlx}", f"experts.{e}.{hf}")] = v[e]


def test_hugging_face_layout_checked_through_sanitize(clean, tmp_path):
    p = _copy(clean("mixtral"), tmp_path / "hf")
    _rewrite(p, _to_hf_experts)
    r = inspect(p)
    assert r.ok and not r.problems, [x.message for x in r.problems]
    assert any("sanitize converts them into 6 tensors" in n for n in r.notes), r.notes


def test_hugging_face_layout_missing_expert(clean, tmp_path):
    p = _copy(clean("mixtral"), tmp_path / "hf")
    gone = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    _rewrite(p, lambda w: (_to_hf_experts(w), w.pop(gone)))
    errs = _errors(inspect(p))
    assert [(e.code, e.tensor) for e in errs] == [("missing-tensor", gone)], [e.message for e in errs]


def test_hugging_face_layout_mis_shaped_expert(clean, tmp_path):
    p = _copy(clean("mixtral"), tmp_path / "hf")
    bad = "model.layers.1.block_sparse_moe.experts.2.w2.weight"
    _rewrite(p, lambda w: (_to_hf_experts(w), w.__setitem__(bad, w[bad][:-1])))
    errs = _errors(inspect(p))
    assert [(e.code, e.tensor) for e in errs] == [("shape-mismatch", bad)], [e.message for e in errs]
    assert "has shape [63, 128], but model.layers.0.block_sparse_moe.experts.0.w2.weight has [64, 128]" \
        in errs[0].message


def test_hugging_face_layout_renamed_tensor_still_misnamed(clean, tmp_path):
    p = _copy(clean("mixtral"), tmp_path / "hf")
    old, new = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.query.weight"
    _rewrite(p, lambda w: (_to_hf_experts(w), w.__setitem__(new, w.pop(old))))
    got = {(e.code, e.tensor) for e in _errors(inspect(p))}
    assert got == {("missing-tensor", old), ("unexpected-tensor", new)}


def test_sanitize_layout_of_a_real_size_checkpoint_allocates_nothing():
    """Mixtral-8x22B's shapes in the Hugging Face layout (448 per-expert tensors of 100M
    elements): placeholders only."""
    from workbench.checkpoint.sanitize_layout import sanitized_layout

    cfg = dict(model_type="mixtral", hidden_size=6144, num_hidden_layers=56, intermediate_size=16384,
               num_attention_heads=48, num_key_value_heads=8, rms_norm_eps=1e-5, vocab_size=32768,
               num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6)
    stored = {}
    for i in range(56):
        for e in range(8):
            for n, shape in (("w1", (16384, 6144)), ("w2", (6144, 16384)), ("w3", (16384, 6144))):
                stored[f"model.layers.{i}.block_sparse_moe.experts.{e}.{n}.weight"] = (shape, "BF16")
    sanitized_layout(dict(zr.ARCHS["mixtral"]), {})  # first-use costs
    gc.collect()
    mx.reset_peak_memory()
    before = rss_mb()
    lay = sanitized_layout(cfg, stored)
    assert rss_mb() - before < 200 and mx.get_peak_memory() < 64 << 20
    assert lay.error is None and len(lay.consumed) == len(stored) and len(lay.produced) == 56 * 3
    assert lay.produced["layers.3.block_sparse_moe.switch_mlp.down_proj.weight"][0] == (8, 6144, 16384)


# ------------------------------------------------------------------ through mlx-vlm
QWEN2_VL_TEXT = {"model_type": "qwen2_vl", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-6,
                 "rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}
QWEN2_VL = dict(QWEN2_VL_TEXT, text_config=dict(QWEN2_VL_TEXT),
                vision_config={"model_type": "qwen2_vl", "depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4,
                               "mlp_ratio": 2.0, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                               "in_chans": 3})


def test_multimodal_checkpoint_built_by_mlx_vlm(tmp_path):
    """Qwen2-VL (no table here, towers in the config): mlx-vlm's model gives the expected
    language-model tensors; the vision tower is its own component."""
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import load_model

    from workbench.checkpoint.reference_arch import build_model

    lib, name, model = build_model(QWEN2_VL, placeholders=False)
    assert (lib, name) == ("mlx_vlm", "qwen2_vl")
    d = tmp_path / "vl"
    d.mkdir()
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (d / "config.json").write_text(json.dumps(QWEN2_VL))
    load_model(d)  # mlx-vlm loads it strictly
    r = inspect(d)
    assert r.ok and not r.problems, [x.message for x in r.problems]
    assert r.model_type == "qwen2_vl" and r.components["vision_tower"] > 0 and r.num_layers == 2
    gone = "language_model.model.layers.1.mlp.up_proj.weight"
    _rewrite(d, lambda w: w.pop(gone))
    assert [(e.code, e.tensor) for e in _errors(inspect(d))] == [("missing-tensor", gone)]


# ------------------------------------------------------------------ agreement with the tables
def _tables():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from models_tiny import CONFIGS
    from workbench.zoo import ARCHS, INSPECT_ONLY_ARCHS, base_config

    out = [(f"tiny:{k}", v) for k, v in CONFIGS.items()]
    out += [(f"zoo:{k}", base_config(k)) for k in ARCHS + INSPECT_ONLY_ARCHS]
    out += [(f"ref:{k}", zr.ARCHS[k]) for k in ALL if registry.table_family(zr.ARCHS[k])]
    return out


@pytest.mark.parametrize("label,config", _tables(), ids=lambda x: x if isinstance(x, str) else "")
def test_hand_written_tables_agree_with_mlx_lm(label, config):
    """Every tensor mlx-lm's model has is in our table with the same shape and
    quantizability; every tensor the table requires is in mlx-lm's model.  What only the
    table has is optional (what it adds: KV-shared k/v that Hugging Face ships, ...)."""
    table = A.build_arch(config)
    ref = reference_tensors(config, library="mlx_lm")
    for n, t in ref.tensors.items():
        e = table.expected.get(n)
        assert e is not None, f"{label}: {n} is in mlx-lm's model but not in the table"
        assert e.shape == t.shape, f"{label}: {n} {e.shape} vs mlx-lm {t.shape}"
        assert e.quantizable == (t.kind in ("linear", "embedding", "experts")), (label, n, e.kind, t.kind)
    extra = [n for n, e in table.expected.items() if n not in ref.tensors and not e.optional]
    assert not extra, f"{label}: the table requires tensors mlx-lm's model does not have: {extra[:5]}"


def test_gemma3n_from_mlx_lm_and_mlx_vlm():
    """Gemma 3n: mlx-lm's model and the table agree (test above); mlx-vlm's builds the same
    language-model tensors when every layer has the same intermediate size, and the
    towers' parameters are not language-model tensors."""
    from workbench.zoo import base_config

    cfg = base_config("gemma3n")
    cfg["text_config"]["intermediate_size"] = [128] * cfg["text_config"]["num_hidden_layers"]
    table = A.build_arch(cfg)
    vlm = reference_tensors(cfg)  # towers in the config: mlx-vlm
    assert vlm.library == "mlx_vlm" and vlm.family == "gemma3n"
    assert {n: t.shape for n, t in vlm.tensors.items()} == {n: e.shape for n, e in table.expected.items()}
    assert not any(n.startswith(("vision_tower", "audio_tower", "embed_")) and "embed_tokens" not in n
                   for n in vlm.tensors)


# ------------------------------------------------------------------ bad configs
def _write_cfg(tmp_path, cfg, src):
    d = _copy(src, tmp_path / "ck")
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_config_the_reference_cannot_build_is_bad_config(clean, tmp_path):
    cfg = dict(zr.ARCHS["phi3"], num_attention_heads="four")
    r = inspect(_write_cfg(tmp_path, cfg, clean("phi3")))
    errs = _errors(r)
    assert [e.code for e in errs] == ["bad-config"]
    assert "'num_attention_heads'" in errs[0].message and "mlx-lm's phi3" in errs[0].message


def test_config_with_a_zero_count_names_it(clean, tmp_path):
    cfg = dict(zr.ARCHS["starcoder2"], num_attention_heads=0)
    r = inspect(_write_cfg(tmp_path, cfg, clean("starcoder2")))
    errs = _errors(r)
    assert [e.code for e in errs] == ["bad-config"] and "num_attention_heads=0" in errs[0].message


def test_implausible_layer_count_is_refused_before_building(clean, tmp_path):
    cfg = dict(zr.ARCHS["olmo2"], num_hidden_layers=10**6)
    r = inspect(_write_cfg(tmp_path, cfg, clean("olmo2")))
    errs = _errors(r)
    assert [e.code for e in errs] == ["bad-config"] and "'num_hidden_layers'" in errs[0].message


def test_unknown_model_type_is_an_error(clean, tmp_path):
    """Nothing builds it, so workbench.load refuses it: inspect never vouches for it (issue 41)."""
    cfg = dict(zr.ARCHS["olmo2"], model_type="no_such_model")
    r = inspect(_write_cfg(tmp_path, cfg, clean("olmo2")))
    bad = [p for p in r.problems if p.code == "bad-config"]
    assert [p.severity for p in bad] == ["error"] and "'no_such_model'" in bad[0].message and not r.ok


# ------------------------------------------------------------------ real-size configs


BIG = {
    # Qwen2.5-32B's shape
    "qwen2": dict(model_type="qwen2", hidden_size=5120, num_hidden_layers=64, intermediate_size=27648,
                  num_attention_heads=40, num_key_value_heads=8, rms_norm_eps=1e-6, vocab_size=152064,
                  rope_theta=1e6, tie_word_embeddings=False),
    # DeepSeek-V3's shape (671B parameters)
    "deepseek_v3": dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5,
                        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                        qk_nope_head_dim=128, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
                        n_group=8, topk_group=4, num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=3,
                        rms_norm_eps=1e-6, rope_theta=10000),
}


@pytest.mark.parametrize("name", list(BIG))
def test_real_size_config_builds_without_allocating(name):
    cfg = BIG[name]
    importlib.import_module(f"mlx_lm.models.{name}")  # the import itself is not the build
    reference_tensors(zr.ARCHS["phi3"])  # nor the first-use costs of mlx
    gc.collect()
    mx.reset_peak_memory()
    before = rss_mb()
    ref = reference_tensors(cfg, library="mlx_lm")
    grew = rss_mb() - before
    params = sum(math.prod(t.shape) for t in ref.tensors.values())
    assert params > 31e9
    assert grew < 200, f"building {name}'s tensor list grew RSS by {grew:.0f} MB"
    assert mx.get_peak_memory() < 64 << 20
    assert ref.num_layers == cfg["num_hidden_layers"]
    emb = ref.tensors["embed_tokens.weight"]
    assert emb.shape == (cfg["vocab_size"], cfg["hidden_size"]) and emb.kind == "embedding"


def test_building_leaves_the_random_state_alone():
    mx.random.seed(7)
    a = mx.random.uniform(shape=(4,))
    mx.random.seed(7)
    reference_tensors(zr.ARCHS["mixtral"])
    b = mx.random.uniform(shape=(4,))
    assert mx.array_equal(a, b)
