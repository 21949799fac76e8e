"""inspect = load (issue 27): for a family with no hand-written table, ``inspect`` checks the
checkpoint as the reference's loader reads it, after the reference's own ``sanitize`` (run
over placeholders of the stored tensors).

On the architectures exactly as transformers 5 writes them (tests/data/archs, written by
tests/data/make_arch_refs.py):

* every case ``workbench.load`` opens inspects clean, and every case it cannot open is
  reported broken (the few that do not load are listed, with why);
* breakage planted in the layouts sanitize converts (a tensor dropped, renamed, mis-shaped:
  per-expert weights it stacks, fused ones it splits, kernels it transposes, MLA's
  ``kv_b_proj``, GPT-2's Conv1D, ...) is reported, by the stored tensor's name, and the
  loader refuses the same checkpoint.
"""
from __future__ import annotations

import gc
import json
import shutil
import sys
from pathlib import Path

import pytest
from memory import rss_mb

import workbench
import mlx.core as mx

from workbench import registry
from workbench.checkpoint.sanitize_layout import sanitized_layout

sys.path.insert(0, str(Path(__file__).parent / "data"))
import make_arch_refs as refs  # noqa: E402

CASES = sorted(refs.CASES)

#: cases workbench.load cannot open, and why; each must be reported broken by inspect too
#: (or, for a reference that cannot be imported at all, refused by both alike)
NOT_LOADING = {
    "glm": "reference_config refuses rope_parameters.partial_rotary_factor 0.5 (mlx-lm's glm rotates every "
           "dimension)",
    "olmo": "mlx-lm's olmo exits when imported without ai2-olmo (registry.MissingExtra)",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """case -> its checkpoint rebuilt from tensors.json (once per module)."""
    root = tmp_path_factory.mktemp("archs")
    made = {}

    def get(case):
        if case not in made:
            made[case] = refs.write_checkpoint(root / case, refs.HERE / case)
        return made[case]
    return get


def _load(path):
    """None when workbench.load opens the checkpoint, else the exception it raised."""
    try:
        workbench.load(path, granularity="module")
    except Exception as e:  # noqa: BLE001 - any refusal is the finding
        return e
    return None


def test_every_case_is_on_disk():
    on_disk = sorted(p.name for p in refs.HERE.iterdir() if (p / "tensors.json").exists())
    assert on_disk == CASES
    assert set(NOT_LOADING) <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_inspect_agrees_with_load(case, written):
    p = written(case)
    err = _load(p)
    if err is None:
        r = workbench.inspect(p)
        assert r.ok, [f"{e.code} {e.tensor}: {e.message}" for e in r.errors]
        assert not r.problems, [x.message for x in r.problems]  # (no warning either: bad-config is an error now)
        return
    assert case in NOT_LOADING, f"{case} does not load: {type(err).__name__}: {err}"
    if isinstance(err, registry.MissingExtra):
        with pytest.raises(registry.MissingExtra):
            workbench.inspect(p)
        return
    r = workbench.inspect(p)
    assert not r.ok, f"{case} does not load ({err}) but inspects clean"


# ------------------------------------------------------------------ planted breakage
# (case, what, stored tensor, new name / shape): what is drop | rename | shape
PLANTS = [
    # MLA: kv_b_proj becomes embed_q / unembed_out; per-expert weights stacked into switch_mlp
    ("deepseek_v3", "drop", "model.layers.0.self_attn.kv_b_proj.weight", None),
    ("deepseek_v3", "rename", "model.layers.1.self_attn.kv_b_proj.weight", "model.layers.1.self_attn.kv_b_prj.weight"),
    ("deepseek_v3", "shape", "model.layers.0.self_attn.kv_b_proj.weight", [120, 16]),
    ("deepseek_v3", "shape", "model.layers.1.self_attn.kv_b_proj.weight", [128, 15]),
    ("deepseek_v3", "drop", "model.layers.1.mlp.experts.2.down_proj.weight", None),
    ("deepseek_v3", "drop", "model.layers.1.mlp.experts.0.gate_proj.weight", None),
    ("deepseek_v3", "rename", "model.layers.1.mlp.experts.1.up_proj.weight", "model.layers.1.mlp.experts.1.upproj.weight"),
    ("deepseek_v3", "shape", "model.layers.1.mlp.experts.3.down_proj.weight", [64, 31]),
    ("deepseek_v3", "shape", "model.layers.1.self_attn.q_b_proj.weight", [95, 32]),
    ("deepseek_v3", "drop", "model.layers.1.mlp.gate.weight", None),
    # q_lora_rank null: q_proj; a dense first layer, a router from layer 1 on
    ("deepseek_v2", "drop", "model.layers.1.self_attn.kv_b_proj.weight", None),
    ("deepseek_v2", "shape", "model.layers.0.self_attn.q_proj.weight", [96, 63]),
    ("deepseek_v2", "drop", "model.layers.1.mlp.gate.weight", None),
    ("deepseek_v2", "rename", "model.layers.1.mlp.experts.3.down_proj.weight",
     "model.layers.1.mlp.expert.3.down_proj.weight"),
    ("deepseek_v2", "shape", "model.layers.1.mlp.experts.0.up_proj.weight", [32, 65]),
    # conv kernels stored [C, 1, K], mlx's [C, K, 1]
    ("mamba", "drop", "backbone.layers.1.mixer.conv1d.weight", None),
    ("mamba", "rename", "backbone.layers.0.mixer.conv1d.weight", "backbone.layers.0.mixer.conv.weight"),
    ("mamba", "shape", "backbone.layers.0.mixer.conv1d.weight", [128, 1, 3]),
    ("mamba", "shape", "backbone.layers.1.mixer.in_proj.weight", [255, 64]),
    ("lfm2", "drop", "model.layers.0.conv.conv.weight", None),
    ("lfm2", "rename", "model.layers.0.conv.conv.weight", "model.layers.0.conv.kernel.weight"),
    ("lfm2", "shape", "model.layers.0.conv.conv.weight", [64, 1, 4]),
    ("qwen3_next", "drop", "model.layers.0.linear_attn.conv1d.weight", None),
    ("qwen3_next", "shape", "model.layers.0.linear_attn.conv1d.weight", [128, 1, 5]),
    ("qwen3_next", "drop", "model.layers.1.mlp.experts.1.up_proj.weight", None),
    ("qwen3_next", "rename", "model.layers.0.mlp.experts.2.gate_proj.weight",
     "model.layers.0.mlp.experts.2.gate.weight"),
    ("qwen3_next", "shape", "model.layers.1.mlp.experts.3.down_proj.weight", [63, 32]),
    ("qwen3_next", "shape", "model.layers.1.input_layernorm.weight", [63]),
    # GPT-2: Conv1D weights [in, out] under transformer.
    ("gpt2", "drop", "transformer.h.1.attn.c_attn.weight", None),
    ("gpt2", "rename", "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.fc.weight"),
    ("gpt2", "shape", "transformer.h.1.attn.c_attn.weight", [64, 191]),
    ("gpt2", "shape", "transformer.h.0.mlp.c_proj.weight", [64, 256]),
    # apertus: xIELU's alpha_n / alpha_p stored [1], scalars in the model
    ("apertus", "drop", "model.layers.1.mlp.act_fn.alpha_n", None),
    ("apertus", "rename", "model.layers.0.mlp.act_fn.alpha_n", "model.layers.0.mlp.act_fn.alpha_neg"),
    ("apertus", "shape", "model.layers.0.mlp.act_fn.alpha_n", [2]),
    # per-expert weights
    ("glm4_moe", "drop", "model.layers.1.mlp.experts.3.gate_proj.weight", None),
    ("glm4_moe", "rename", "model.layers.1.mlp.experts.0.down_proj.weight", "model.layers.1.mlp.experts.0.down.weight"),
    ("glm4_moe", "shape", "model.layers.1.mlp.experts.1.up_proj.weight", [31, 64]),
    # granitemoe: fused input_linear [E, 2I, D] split into gate / up
    ("granitemoe", "drop", "model.layers.1.block_sparse_moe.input_linear.weight", None),
    ("granitemoe", "drop", "model.layers.0.block_sparse_moe.input_linear.weight", None),
    ("granitemoe", "rename", "model.layers.1.block_sparse_moe.output_linear.weight",
     "model.layers.1.block_sparse_moe.out_linear.weight"),
    ("granitemoe", "shape", "model.layers.1.block_sparse_moe.input_linear.weight", [4, 254, 64]),
    ("granitemoe", "shape", "model.layers.0.block_sparse_moe.output_linear.weight", [4, 64, 127]),
    # gpt_oss: float experts as transformers stores them ([E, in, out], gate / up interleaved)
    ("gpt_oss", "drop", "model.layers.1.mlp.experts.gate_up_proj", None),
    ("gpt_oss", "drop", "model.layers.0.mlp.experts.down_proj_bias", None),
    ("gpt_oss", "rename", "model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.experts.down"),
    ("gpt_oss", "shape", "model.layers.1.mlp.experts.gate_up_proj", [4, 64, 254]),
    ("gpt_oss", "shape", "model.layers.0.mlp.experts.down_proj", [4, 128, 63]),
]


def _planted(case, what, name, arg, dest: Path) -> Path:
    spec = json.loads((refs.HERE / case / "tensors.json").read_text())
    assert name in spec, f"{case} stores no {name}"
    if what == "drop":
        del spec[name]
    elif what == "rename":
        spec[arg] = spec.pop(name)
    else:
        assert spec[name][0] != arg
        spec[name][0] = arg
    src = dest / "case"
    src.mkdir(parents=True)
    shutil.copyfile(refs.HERE / case / "config.json", src / "config.json")
    (src / "tensors.json").write_text(json.dumps(spec))
    return refs.write_checkpoint(dest / "ck", src)


def test_plants_cover_the_issue_list():
    covered = {(c, w) for c, w, _, _ in PLANTS}
    for case in ("deepseek_v3", "deepseek_v2", "mamba", "lfm2", "qwen3_next", "gpt2", "apertus", "glm4_moe",
                 "granitemoe", "gpt_oss"):
        assert {(case, w) for w in ("drop", "rename", "shape")} <= covered, case
    assert not set(c for c, *_ in PLANTS) & set(NOT_LOADING)


@pytest.mark.parametrize("case,what,name,arg", PLANTS, ids=lambda x: x if isinstance(x, str) else "")
def test_planted_breakage_is_found_by_its_stored_name(case, what, name, arg, tmp_path, written):
    assert _load(written(case)) is None, f"{case}'s sound checkpoint must load"
    p = _planted(case, what, name, arg, tmp_path)
    err = _load(p)
    assert err is not None, f"the loader takes {case} with {name} {what}: not a breakage"
    r = workbench.inspect(p)
    errs = {(e.code, e.tensor) for e in r.errors}
    msgs = [f"{e.code} {e.tensor}: {e.message}" for e in r.errors]
    assert not r.ok
    if what == "drop":
        assert ("missing-tensor", name) in errs, msgs
    elif what == "rename":
        assert ("unexpected-tensor", arg) in errs, msgs
        assert ("missing-tensor", name) in errs, msgs
    else:
        assert ("shape-mismatch", name) in errs, msgs
    # every problem names a tensor as stored (or the one the plant took away)
    stored = set(json.loads((p.parent / "case" / "tensors.json").read_text())) | {name}
    assert {t for _, t in errs} <= stored, msgs


# ------------------------------------------------------------------ bounded


def test_deepseek_v3_layout_of_a_real_size_checkpoint_allocates_nothing():
    """DeepSeek-V3's shapes as Hugging Face stores them (61 layers, 256 experts each:
    ~44k per-expert tensors, kv_b_proj per layer), with one expert tensor missing and one
    kv_b_proj mis-shaped: placeholders only, each found by its stored name."""
    cfg = json.loads((refs.HERE / "deepseek_v3" / "config.json").read_text())
    cfg.update(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
               num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256,
               kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
               head_dim=64, qk_head_dim=192, n_group=8, topk_group=4, num_experts_per_tok=8,
               first_k_dense_replace=3)
    stored = {}
    for i in range(61):
        pre = f"model.layers.{i}."
        stored[pre + "self_attn.kv_b_proj.weight"] = ((128 * 256, 512), "BF16")
        stored[pre + "self_attn.q_b_proj.weight"] = ((128 * 192, 1536), "BF16")
        if i >= 3:
            for e in range(256):
                for n, shape in (("gate_proj", (2048, 7168)), ("up_proj", (2048, 7168)),
                                 ("down_proj", (7168, 2048))):
                    stored[f"{pre}mlp.experts.{e}.{n}.weight"] = (shape, "BF16")
    gone = "model.layers.40.mlp.experts.17.up_proj.weight"
    odd = "model.layers.7.self_attn.kv_b_proj.weight"
    del stored[gone]
    stored[odd] = ((128 * 256 - 8, 512), "BF16")
    sanitized_layout(json.loads((refs.HERE / "deepseek_v3" / "config.json").read_text()), {})  # first-use costs
    gc.collect()
    mx.reset_peak_memory()
    before = rss_mb()
    lay = sanitized_layout(cfg, stored)
    assert rss_mb() - before < 400 and mx.get_peak_memory() < 64 << 20
    assert {(c, t) for c, _, t in lay.repairs} == {("missing-tensor", gone), ("shape-mismatch", odd)}
    assert lay.produced["layers.40.mlp.switch_mlp.up_proj.weight"][0] == (256, 2048, 7168)
    assert lay.produced["layers.9.self_attn.embed_q.weight"][1] == ["model.layers.9.self_attn.kv_b_proj.weight"]
