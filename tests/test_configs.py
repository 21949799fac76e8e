"""Configs are read exactly or refused (issue 13, item 1).

* Checkpoints whose config.json transformers 5.24 wrote (``rope_parameters`` with llama3 /
  yarn RoPE, Gemma 3's per-layer-type RoPE with linear x8 scaling, Gemma 4's
  ``per_layer_config``), with weights built here from a seeded generator, give the
  logits torch + transformers computed (tests/data/configs/*/logits.npy, written by
  tests/data/make_config_refs.py);
* the older flat forms of the same configs, which mlx-lm reads, give the same logits in
  mlx-lm and here; a multimodal wrapper without a top-level vocab_size reads its text
  config's;
* a key that changes the numbers and is not handled is refused by name (load, inspect,
  the CLI: one line, exit 2), and load checks every tensor's shape first;
* any value of a config field gives a model or a one-line ValueError naming the field:
  never a traceback, a hang or a huge allocation;
* configs as published (issue 40, items 2 and 3b: SmolLM2's nanotron leftovers, Qwen1.5-MoE's
  max_window_layers under use_sliding_window false, GPT-BigCode's n_inner null, Mamba 2 without
  intermediate_size, dots1 / afmoe without the keys transformers does not write) open with the
  logits of their explicit form; a hunyuan_v1_moe config with an option its original does not
  have (mlx-lm's hunyuan would read it) is refused in one line naming it.  (hunyuan_v1_moe,
  ernie4_5_moe and afmoe with one expert, once refused, are corrected: tests/test_arch_refs.py.)
"""
from __future__ import annotations

import copy
import importlib.util
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workbench
import mlx.core as mx

from workbench.checkpoint.arch import KEYS, ConfigError, build_arch
from workbench.cli import main
from workbench.models.model import CheckpointMismatch

DATA = Path(__file__).parent / "data" / "configs"
_spec = importlib.util.spec_from_file_location("make_config_refs", DATA.parent / "make_config_refs.py")
refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refs)
CASES = sorted(refs.CASES)
IDS = mx.array(refs.IDS)


def transformers_config(case: str) -> dict:
    return json.loads((DATA / case / "config.json").read_text())


def write(dest: Path, config: dict, weights: dict | None = None, prefix: str = "model.") -> Path:
    """A checkpoint: ``config`` as config.json, ``weights`` (default: refs.weights(config)) as
    model.safetensors with ``prefix`` before every name but lm_head."""
    dest.mkdir(parents=True, exist_ok=True)
    w = refs.weights(config) if weights is None else weights
    mx.save_safetensors(str(dest / "model.safetensors"),
                        {(n if n.startswith("lm_head") else prefix + n): mx.array(v) for n, v in w.items()})
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def logits(path) -> np.ndarray:
    return np.array(workbench.load(path)(IDS))


def test_the_data_is_what_transformers_writes():
    """The committed configs hold the transformers >= 5 forms this file is about."""
    assert transformers_config("llama3_rope")["rope_parameters"]["rope_type"] == "llama3"
    assert "rope_theta" not in transformers_config("llama3_rope")
    assert "rope_scaling" not in transformers_config("llama3_rope")
    assert transformers_config("gemma3_linear")["rope_parameters"]["full_attention"]["rope_type"] == "linear"
    g4 = transformers_config("gemma4_per_layer")
    assert g4["per_layer_config"] == {"1": {"head_dim": 32, "num_key_value_heads": 1},
                                      "3": {"head_dim": 32, "num_key_value_heads": 1}}
    assert "global_head_dim" not in g4 and "num_global_key_value_heads" not in g4
    assert all(c["transformers_version"] == "5.24.0" for c in map(transformers_config, CASES))
    assert sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file()) < 200_000


# ---------------------------------------------------------------- logits == transformers


@pytest.mark.parametrize("case", CASES)
def test_transformers_config_matches_torch_logits(tmp_path, case):
    path = write(tmp_path / case, transformers_config(case))
    r = workbench.inspect(path)
    assert r.ok and not r.problems, [p.message for p in r.problems]
    ref = np.load(DATA / case / "logits.npy")
    out = logits(path)
    assert out.shape == ref.shape
    assert rel_err(out, ref) <= 1e-5


def _misread(case: str) -> dict:
    """The config as a reader that ignores the new forms would take it (the issue's bugs)."""
    c = transformers_config(case)
    if case == "llama3_rope":
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    elif case == "gemma3_linear":
        c["rope_parameters"]["full_attention"] = {"rope_type": "default", "rope_theta": 1000000.0}
    elif case == "qwen3_yarn":
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    return c


@pytest.mark.parametrize("case", ["llama3_rope", "gemma3_linear", "qwen3_yarn"])
def test_ignoring_the_rope_form_would_be_caught(tmp_path, case):
    """The reference tells the RoPE apart: the same weights read with plain RoPE are far off."""
    w = refs.weights(transformers_config(case))
    out = logits(write(tmp_path / case, _misread(case), w))
    assert rel_err(out, np.load(DATA / case / "logits.npy")) > 1e-2


def _flat(case: str) -> dict:
    """The same model in the older flat form (what transformers 4 wrote and mlx-lm reads)."""
    c = transformers_config(case)
    if case in ("llama3_rope", "qwen3_yarn"):
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = rp
    elif case == "gemma3_linear":
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp["full_attention"].pop("rope_theta")
        c["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
        c["rope_scaling"] = rp["full_attention"]
        c["sliding_window_pattern"] = 2  # what layer_types says, for mlx-lm, which reads only the pattern
    elif case.startswith("gemma4"):
        plc = c.pop("per_layer_config")
        c["global_head_dim"] = plc["1"]["head_dim"]
        if "num_key_value_heads" in plc["1"]:
            c["num_global_key_value_heads"] = plc["1"]["num_key_value_heads"]
    return c


@pytest.mark.parametrize("case", CASES)
def test_older_flat_form_reads_the_same_here_and_in_mlx_lm(tmp_path, case):
    from mlx_lm.utils import load_model

    w = refs.weights(transformers_config(case))
    new = logits(write(tmp_path / "new", transformers_config(case), w))
    flat = write(tmp_path / "flat", _flat(case), w)
    assert rel_err(logits(flat), new) <= 1e-6
    ref_model, _ = load_model(flat)
    assert rel_err(np.array(ref_model(IDS)), np.load(DATA / case / "logits.npy")) <= 1e-5


def _wrap(text: dict, vocab: int | None) -> dict:
    c = {"model_type": "gemma4", "text_config": dict(text), "tie_word_embeddings": True,
         "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32}}
    if vocab is not None:
        c["vocab_size"] = vocab
    return c


def test_multimodal_wrapper_without_vocab_size_reads_its_text_config(tmp_path):
    text = transformers_config("gemma4_per_layer")
    w = refs.weights(text)
    path = write(tmp_path / "mm", _wrap(text, None), w, prefix="language_model.model.")
    r = workbench.inspect(path)
    assert r.ok and not r.problems, [p.message for p in r.problems]
    assert rel_err(logits(path), np.load(DATA / "gemma4_per_layer" / "logits.npy")) <= 1e-5
    # a top-level vocab_size that contradicts the text config's is refused, naming both
    (path / "config.json").write_text(json.dumps(_wrap(text, 1000)))
    with pytest.raises(ConfigError, match="vocab_size = 1000 and text_config.vocab_size = 256"):
        workbench.load(path)


# ---------------------------------------------------------------- refused by name

def _set(c: dict, dotted: str, value):
    *path, last = dotted.split(".")
    for k in path:
        c = c[k]
    if value is _DELETE:
        del c[last]
    else:
        c[last] = value


_DELETE = object()

REFUSED = [
    ("llama3_rope", "rope_parameters.rope_type", "longrope", "rope_type 'longrope'"),
    # (dynamic is read now, workbench/rope.py; the llama3 keys left beside it are not dynamic's)
    ("llama3_rope", "rope_parameters.rope_type", "dynamic", "factor is not handled for rope type 'dynamic'"),
    ("llama3_rope", "rope_parameters.original_max_position_embeddings", _DELETE,
     "rope_parameters.original_max_position_embeddings"),
    ("llama3_rope", "rope_parameters.partial_rotary_factor", 0.5, "partial_rotary_factor"),
    ("llama3_rope", "rope_theta", 10000.0, "rope_theta"),  # disagrees with rope_parameters.rope_theta
    ("llama3_rope", "hidden_act", "gelu", "hidden_act"),
    ("llama3_rope", "logit_scale", 0.5, "'logit_scale'"),
    ("qwen3_yarn", "rope_parameters.truncate", "yes", "truncate"),
    ("qwen3_yarn", "rope_parameters.short_factor", [1.0], "rope_parameters.short_factor"),
    ("gemma3_linear", "attn_logit_softcapping", 50.0, "attn_logit_softcapping"),
    ("gemma3_linear", "use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("gemma3_linear", "hidden_activation", "gelu", "hidden_activation"),
    ("gemma3_linear", "rope_parameters.full_attention.rope_type", "yarn",
     "rope_parameters.full_attention.original_max_position_embeddings"),
    ("gemma4_per_layer", "per_layer_config.1.intermediate_size", 10, "per_layer_config.1.intermediate_size"),
    ("gemma4_per_layer", "per_layer_config.9", {"head_dim": 32}, "per_layer_config key '9'"),
    ("gemma4_per_layer", "use_bidirectional_attention", "all", "use_bidirectional_attention"),
    ("gemma4_per_layer", "attention_bias", True, "attention_bias"),
    ("gemma4_per_layer", "global_head_dim", 64, "global_head_dim = 64 disagrees"),
    ("gemma4_per_layer", "rope_theta", 10000.0, "'rope_theta'"),
]


@pytest.mark.parametrize("case,key,value,named", REFUSED, ids=[f"{c}-{k}" for c, k, v, _ in REFUSED])
def test_unhandled_number_changing_key_is_refused_by_name(tmp_path, capsys, case, key, value, named):
    cfg = transformers_config(case)
    w = refs.weights(cfg)
    _set(cfg, key, value if value is _DELETE else copy.deepcopy(value))
    path = write(tmp_path / "ck", cfg, w)
    with pytest.raises(ConfigError) as e:
        workbench.load(path)
    assert named in str(e.value) and "\n" not in str(e.value)
    # inspect: the same sentence, one bad-config error
    r = workbench.inspect(path)
    assert not r.ok and [p.code for p in r.errors] == ["bad-config"]
    assert named in r.errors[0].message
    # a command that loads the model: one line on stderr naming it, exit 2
    capsys.readouterr()
    assert main(["hunt", str(path), "--ids", "1,2,3"]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1 and "Traceback" not in err


def test_harmless_keys_transformers_writes_are_accepted():
    """Every key of every config class transformers writes for our families, at its
    default, is read or knowingly ignored (a full to_dict, not only the diff)."""
    import transformers

    for cls, fam in (("LlamaConfig", "llama"), ("MistralConfig", "llama"), ("Qwen2Config", "llama"),
                     ("Qwen3Config", "qwen3"), ("Gemma3TextConfig", "gemma3_text"),
                     ("Gemma4TextConfig", "gemma4_text")):
        d = json.loads(getattr(transformers, cls)(num_hidden_layers=6).to_json_string(use_diff=False))
        a = build_arch(d)
        assert a.family == fam and a.num_layers == 6, cls
        assert set(d) <= KEYS[fam].handled | KEYS[fam].ignored | set(KEYS[fam].only) | \
            __import__("workbench.checkpoint.arch", fromlist=["COMMON_IGNORED"]).COMMON_IGNORED


@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4_moe", "gemma4_kv", "gemma4", "gemma3_text", "gemma3",
                                  "qwen3", "llama"])
def test_zoo_and_demo_configs_still_load(tmp_path, arch):
    from workbench import zoo

    model = workbench.load(zoo.build(arch, tmp_path / arch, dtype="float32"))
    assert np.isfinite(np.array(model(IDS[:, :4]))).all()
    assert workbench.load(Path(__file__).parent.parent / "assets" / "demo").family == "gemma4_text"


def test_load_checks_every_shape_first(tmp_path):
    """A config that does not fit the tensors is refused before anything runs, with
    inspect's message (the issue's per_layer_config case: a reshape error deep inside)."""
    cfg = transformers_config("gemma4_per_layer")
    w = refs.weights(cfg)
    cfg["per_layer_config"]["3"]["head_dim"] = 16  # layer 3's tensors are for 32
    cfg["per_layer_config"]["1"]["head_dim"] = 16
    path = write(tmp_path / "ck", cfg, w)
    first = workbench.inspect(path).errors[0]
    assert first.code == "shape-mismatch" and "layers.1.self_attn" in first.message
    with pytest.raises(CheckpointMismatch) as e:
        workbench.load(path)
    assert first.message in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- any value: a model or one clear line

_FIELDS = {
    "llama3_rope": ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                    "intermediate_size", "vocab_size", "rms_norm_eps", "rope_parameters.rope_theta",
                    "rope_parameters.factor", "rope_parameters.low_freq_factor",
                    "rope_parameters.original_max_position_embeddings", "tie_word_embeddings"],
    "gemma3_linear": ["num_hidden_layers", "num_key_value_heads", "head_dim", "sliding_window",
                      "query_pre_attn_scalar", "rope_parameters.full_attention.factor",
                      "rope_parameters.sliding_attention.rope_theta", "final_logit_softcapping", "layer_types"],
    "gemma4_per_layer": ["num_hidden_layers", "num_kv_shared_layers", "hidden_size_per_layer_input",
                         "per_layer_config.1.head_dim", "per_layer_config.3.num_key_value_heads",
                         "rope_parameters.full_attention.partial_rotary_factor", "final_logit_softcapping",
                         "attention_k_eq_v", "sliding_window", "per_layer_config"],
    "qwen3_yarn": ["rope_parameters.factor", "rope_parameters.beta_fast", "rope_parameters.attention_factor",
                   "max_window_layers", "use_sliding_window", "sliding_window"],
}
_VALUES = st.one_of(
    st.sampled_from([0, -1, -7, 1, 2, 3, 16, 32, 10 ** 9, 2 ** 40, True, False, None, "8", [], {}, [1, 2],
                     0.0, -0.5, 0.5, 1.0, 1e-12, 1e300, float("nan"), float("inf"), float("-inf")]),
    st.integers(-4, 300), st.floats(allow_nan=True, allow_infinity=True))


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory):
    """One weights file per case; examples only rewrite config.json beside a link to it."""
    out = {}
    for case in _FIELDS:
        out[case] = write(tmp_path_factory.mktemp(case), transformers_config(case))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_config_value_gives_a_model_or_one_clear_line(base_dirs, tmp_path_factory, data):
    case = data.draw(st.sampled_from(sorted(_FIELDS)))
    key = data.draw(st.sampled_from(_FIELDS[case]))
    value = data.draw(_VALUES)
    cfg = transformers_config(case)
    _set(cfg, key, value)
    d = tmp_path_factory.mktemp("ex")
    (d / "model.safetensors").symlink_to(base_dirs[case] / "model.safetensors")
    (d / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    try:
        model = workbench.load(d)
    except (ConfigError, CheckpointMismatch) as e:
        msg = str(e)
        assert "\n" not in msg and msg
        # the field is named, or (a value that changes shapes) the tensor that no longer fits
        assert key.split(".")[-1] in msg or "layer_types" in msg or isinstance(e, CheckpointMismatch) or \
            "num_attention_heads" in msg or "num_kv_shared_layers" in msg or "num_hidden_layers" in msg, msg
    else:
        out = np.array(model(IDS[:, :6]))
        assert out.shape[:2] == (1, 6)
    assert time.perf_counter() - t0 < 20


def test_huge_layer_count_is_refused_before_allocating():
    cfg = transformers_config("llama3_rope")
    cfg["num_hidden_layers"] = 10 ** 9
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="num_hidden_layers"):
            build_arch(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2 ** 20


def test_clip_bound_infinities_are_not_value_errors(tmp_path):
    """transformers' clippable linears store +Inf upper / -Inf lower bounds for "no clipping":
    inspect --values accepts exactly those, and still reports NaN or a wrong-signed infinity."""
    text = transformers_config("gemma4_per_layer")
    w = {"language_model.model." + n: v for n, v in refs.weights(text).items()}
    tower = "audio_tower.layers.0.self_attn.q_proj"
    for suffix, v in (("input_max", np.inf), ("input_min", -np.inf), ("output_max", np.nan), ("output_min", np.inf)):
        w[f"{tower}.{suffix}"] = np.array([v], np.float32)
    path = write(tmp_path / "mm", _wrap(text, None), w, prefix="")
    r = workbench.inspect(path, values=True, progress=False)
    assert sorted(p.tensor for p in r.errors if p.code == "nonfinite-values") == \
        [f"{tower}.output_max", f"{tower}.output_min"]


# ---------------------------------------------------------------- configs as published (issue 40: 2, 3b)
#
# config.json as the model repositories publish them, sizes shrunk and every other key kept;
# weights written by mlx-lm's classes (workbench.zoo.reference) from the same config with the
# derived value written out / the unread key removed.  Each opens, and its logits equal those of
# that explicit form: the proof that the key cannot change the numbers.

_TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256)

#: HuggingFaceTB/SmolLM2-135M (transformers 4.40.1), shrunk
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "initializer_range": 0.041666666666666664,
           "is_llama_config": True, "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama",
           "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
           "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
           "transformers_version": "4.40.1", "use_cache": True, **_TINY}

#: Qwen/Qwen1.5-MoE-A2.7B (transformers 4.39.0.dev0), shrunk
QWEN15_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
              "eos_token_id": 151643, "hidden_act": "silu", "initializer_range": 0.02,
              "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
              "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "transformers_version": "4.39.0.dev0", "use_cache": True,
              "use_sliding_window": False, "decoder_sparse_step": 1, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 128, "num_experts_per_tok": 2, "num_experts": 4,
              "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001,
              **dict(_TINY, num_key_value_heads=4)}

#: bigcode/tiny_starcoder_py (transformers 4.28.1), shrunk: n_inner null means 4 x n_embd
BIGCODE = {"activation_function": "gelu_pytorch_tanh", "architectures": ["GPTBigCodeForCausalLM"],
           "attention_softmax_in_fp32": True, "attn_pdrop": 0.1, "bos_token_id": 0, "embd_pdrop": 0.1,
           "eos_token_id": 0, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt_bigcode",
           "multi_query": True, "n_embd": 64, "n_head": 4, "n_inner": None, "n_layer": 2, "n_positions": 512,
           "resid_pdrop": 0.1, "scale_attention_softmax_in_fp32": True, "scale_attn_weights": True,
           "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
           "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32",
           "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 256}

#: transformers 5.25's Mamba2Config save (no intermediate_size: expand x hidden_size), shrunk
MAMBA2 = {"architectures": ["Mamba2ForCausalLM"], "bos_token_id": 0, "chunk_size": 256, "conv_kernel": 4,
          "eos_token_id": 2, "expand": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
          "initializer_range": 0.1, "layer_norm_epsilon": 1e-05, "model_type": "mamba2", "n_groups": 2,
          "num_heads": 8, "num_hidden_layers": 2, "pad_token_id": 1, "rescale_prenorm_residual": False,
          "residual_in_fp32": True, "state_size": 16, "tie_word_embeddings": False, "time_step_floor": 0.0001,
          "time_step_limit": [0.0, float("inf")], "time_step_max": 0.1, "time_step_min": 0.001,
          "time_step_rank": "auto", "transformers_version": "5.25.0", "use_bias": False, "use_cache": True,
          "use_conv_bias": True, "vocab_size": 256}

#: transformers 5.25 saves (Dots1Config / AfmoeConfig, sizes shrunk): no scoring_func / route_norm,
#: whose mlx-lm defaults workbench reviewed against the original's router (REVIEWED_DEFAULTS)
DOTS1 = {"transformers_version": "5.25.0", "intermediate_size": 128, "moe_intermediate_size": 32,
         "n_shared_experts": 1, "n_routed_experts": 4, "output_router_logits": False, "n_group": 1, "topk_group": 1,
         "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": False, "hidden_act": "silu",
         "max_position_embeddings": 2048, "initializer_range": 0.02, "rms_norm_eps": 1e-06, "use_cache": True,
         "tie_word_embeddings": False, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
         "attention_bias": False, "attention_dropout": 0.0, "routed_scaling_factor": 1.0, "sliding_window": 4096,
         "max_window_layers": 62, "layer_types": ["full_attention", "full_attention"], "pad_token_id": None,
         "bos_token_id": None, "eos_token_id": None, "head_dim": 16, "model_type": "dots1", **_TINY}
AFMOE = {"transformers_version": "5.25.0", "moe_intermediate_size": 32, "num_dense_layers": 1, "head_dim": 16,
         "hidden_act": "silu", "max_position_embeddings": 16384, "initializer_range": 0.02, "rms_norm_eps": 1e-05,
         "use_cache": True, "tie_word_embeddings": False,
         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "num_experts": 4,
         "num_experts_per_tok": 2, "num_shared_experts": 1, "route_scale": 1.0, "output_router_logits": False,
         "global_attn_every_n_layers": 4, "sliding_window": 1024,
         "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
         "attention_dropout": 0.0, "mup_enabled": False, "eos_token_id": None, "pad_token_id": None,
         "bos_token_id": None, "attention_bias": False, "model_type": "afmoe", **dict(_TINY, num_hidden_layers=4)}


def _explicit(cfg: dict, **values) -> dict:
    """``cfg`` as the reader fills it (what mlx-lm's ModelArgs then reads), with ``values`` written."""
    from workbench.checkpoint import reference_config as RC

    return dict(RC.normalise(cfg, "mlx_lm", cfg["model_type"]).config, **values)


#: case -> (published config, the explicit form mlx-lm builds the same model from, granularities)
PUBLISHED = {
    # (scoring_func written as "softmax": mlx-lm's dots1 never reads it, the logits do not move)
    "dots1_no_scoring_func": (DOTS1, _explicit(DOTS1, scoring_func="softmax"), ("module",)),
    "afmoe_no_route_norm": (AFMOE, _explicit(AFMOE, route_norm=True, score_func="sigmoid", n_group=1, topk_group=1),
                            ("module",)),
    "smollm2_leftovers": (SMOLLM2, {k: v for k, v in SMOLLM2.items() if k not in ("is_llama_config", "rope_interleaved")},
                          (None, "module")),
    "qwen15_moe_max_window_layers": (QWEN15_MOE, {k: v for k, v in QWEN15_MOE.items() if k != "max_window_layers"},
                                     ("module",)),
    "gpt_bigcode_n_inner_null": (BIGCODE, dict(BIGCODE, n_inner=256), ("module",)),
    "mamba2_no_intermediate_size": (MAMBA2, dict(MAMBA2, intermediate_size=128), ("module",)),
}


def _pair(tmp_path, case):
    """(published, explicit): two checkpoints of the same weights."""
    from workbench.zoo import reference as zr

    published, explicit, _ = PUBLISHED[case]
    a = zr.write(tmp_path / "explicit", explicit)
    b = tmp_path / "published"
    b.mkdir()
    (b / "model.safetensors").symlink_to(a / "model.safetensors")
    (b / "config.json").write_text(json.dumps(published))
    return b, a


@pytest.mark.parametrize("case", sorted(PUBLISHED))
def test_published_config_opens_with_the_numbers_of_its_explicit_form(tmp_path, case):
    published, explicit = _pair(tmp_path, case)
    for granularity in PUBLISHED[case][2]:
        kw = {} if granularity is None else {"granularity": granularity}
        r = workbench.inspect(published)
        assert r.ok, [p.message for p in r.errors]
        out = np.array(workbench.load(published, **kw)(IDS))
        ref = np.array(workbench.load(explicit, **kw)(IDS))
        assert np.isfinite(out).all() and out.shape == ref.shape
        assert np.array_equal(out, ref), (granularity, rel_err(out, ref))
    # and mlx-lm itself, given the explicit form, computes the same (but for gpt_bigcode, whose
    # gelu_pytorch_tanh workbench corrects: mlx-lm's is the exact GELU)
    from workbench.zoo import reference as zr

    if case != "gpt_bigcode_n_inner_null":
        assert rel_err(out, np.array(zr.reference(explicit)(IDS))) <= 1e-5


def test_the_leftovers_and_derivations_are_in_the_readers_tables():
    from workbench.checkpoint import reference_config as RC

    assert {"is_llama_config", "rope_interleaved"} <= set(RC.KEPT_UNREAD) and \
        set(RC.KEPT_UNREAD) <= RC.COMMON_IGNORED
    assert "use_sliding_window" in RC.DERIVATION_ONLY["max_window_layers"]
    assert set(RC.DERIVED["gpt_bigcode"]) == {"n_inner"} and set(RC.DERIVED["mamba2"]) == {"intermediate_size"}
    n = RC.normalise(BIGCODE, "mlx_lm", "gpt_bigcode")
    assert n.config["n_inner"] == 256 and n.filled["n_inner"] == 256
    assert RC.normalise(MAMBA2, "mlx_lm", "mamba2").config["intermediate_size"] == 128
    # the window Qwen1.5-MoE switches off bounds no prompt
    assert RC.normalise(QWEN15_MOE, "mlx_lm", "qwen2_moe").max_tokens is None


def test_max_window_layers_that_changes_the_layer_types_slides_those_layers(tmp_path):
    """With use_sliding_window true, max_window_layers picks the sliding layers (from it on, as
    Qwen2Config derives layer_types): applied at module level (checkpoint/corrections/windows.py;
    torch's logits: tests/test_arch_refs.py qwen2_window), no prompt bounded."""
    from workbench.zoo import reference as zr

    cfg = dict(zr.ARCHS["qwen2"])
    d = zr.write(tmp_path / "q", cfg)
    (d / "config.json").write_text(json.dumps(dict({"max_window_layers": 1, "use_sliding_window": True,
                                                    "sliding_window": 4}, **cfg)))
    model = workbench.load(d, granularity="module")
    assert model.max_tokens is None
    layers = model.module()[0].layers
    assert [getattr(layer.self_attn, "sliding_window", None) for layer in layers] == [None, 4]


_HUNYUAN = {"model_type": "hunyuan_v1_moe", "architectures": ["HunYuanMoEV1ForCausalLM"], "num_experts": 4,
            "moe_topk": 2, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-05,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, **_TINY}


@pytest.mark.parametrize("cfg,why", [
    (dict(_HUNYUAN, use_cla=True), "use_cla = true, but the original hunyuan_v1_moe has no such option"),
    (dict(_HUNYUAN, num_shared_expert=[2, 2]), "num_shared_expert = [2, 2], but the original hunyuan_v1_moe"),
    (dict(_HUNYUAN, rope_parameters={"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}),
     "mlx-lm's hunyuan rotates with NTK alpha scaling only"),
])
def test_what_mlx_lms_hunyuan_would_read_otherwise_than_the_original_is_refused_by_name(tmp_path, capsys, cfg, why):
    """hunyuan_v1_moe is built by mlx-lm's hunyuan (its routing corrected), which reads options
    transformers' HunYuanMoEV1 does not have (cross-layer attention, several shared MLPs) and
    rotates with NTK-alpha RoPE only: a config that would make it compute otherwise is refused
    by load, inspect and the CLI in one line naming the key (never 'ok', never a traceback)."""
    d = tmp_path / "hy"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(d / "model.safetensors"), {"model.embed_tokens.weight": mx.zeros((256, 64))})
    with pytest.raises(ValueError, match=why.replace("[", "\\[").replace("]", "\\]")) as e:
        workbench.load(d)
    assert "\n" not in str(e.value) and "not checked that default" not in str(e.value)
    r = workbench.inspect(d)
    assert not r.ok and why in r.errors[0].message
    capsys.readouterr()
    assert main(["hunt", str(d), "--ids", "1,2,3"]) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1 and "Traceback" not in err
