"""Checkpoints exactly as transformers 5 writes them give torch's logits, or one line (issue 27).

tests/data/archs/ holds, per architecture, the config.json and tensor list that
transformers 5's own ``save_pretrained`` wrote and the logits torch computed
(tests/data/make_arch_refs.py; torch is not a test dependency).  Each case is rebuilt
here bit for bit and opened as a user would:

* module granularity (mlx-lm, the config normalised by checkpoint/reference_config.py)
  and, for the op families, op granularity: logits within 1e-4 of max |logit| (float32);
* the same configs in the older (transformers 4.x) flat form: the same logits;
* a family that never applies the config's sliding window is exact up to the window and
  refuses a longer prompt in one line;
* what cannot be computed exactly is refused, by name, with exit 2 from the CLI;
* for every architecture mlx-lm builds that transformers also has, each field mlx-lm
  reads is given by the config, taken from the original model's config, or a default
  checked against the original (REVIEWED_DEFAULTS), or the config is refused: never a
  silent default.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench import registry
from workbench.checkpoint import reference_config as RC
from workbench.cli import main

DATA = Path(__file__).parent / "data" / "archs"
_spec = importlib.util.spec_from_file_location("make_arch_refs", DATA.parent / "make_arch_refs.py")
refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refs)
IDS = refs.IDS[0]

#: cases that cannot be computed exactly, and the words their one-line refusal holds
REFUSED = {
    "glm": "partial_rotary_factor",        # mlx-lm's glm rotates every dimension; GLM rotates half
    "olmo": "ai2-olmo",                    # mlx-lm's olmo exits at import without ai2-olmo
}
#: cases whose family never applies the config's sliding window (4 tokens here)
WINDOWED = {"gemma2", "mistral", "mixtral", "phi3", "starcoder2", "phimoe"}
OP_FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma4_text"}
CASES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
TOL = 1e-4


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    return {c: refs.write_checkpoint(root / c, DATA / c) for c in CASES}


def test_the_fixture_set_is_what_transformers_5_writes():
    assert len(CASES) >= 40 and set(CASES) == set(refs.CASES)
    for c in CASES:
        cfg = json.loads((DATA / c / "config.json").read_text())
        assert cfg["transformers_version"].startswith("5."), c
        assert "rope_theta" not in cfg, c  # transformers 5 keeps RoPE in rope_parameters only
    assert sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file()) < 1_500_000


@pytest.mark.parametrize("case", [c for c in CASES if c not in REFUSED])
def test_module_level_logits_equal_torch(ckpts, case):
    ref = np.load(DATA / case / "logits.npy")
    model = workbench.load(ckpts[case], granularity="module")
    n = model.max_tokens or len(IDS)
    assert (model.max_tokens is not None) == (case in WINDOWED), (case, model.max_tokens)
    out = np.array(model(mx.array([IDS[:n]])).astype(mx.float32))
    assert rel_err(out, ref[:, :n]) <= TOL, (case, rel_err(out, ref[:, :n]))


@pytest.mark.parametrize("case", sorted(WINDOWED))
def test_a_window_the_reference_never_applies_bounds_the_prompt(ckpts, case):
    model = workbench.load(ckpts[case], granularity="module")
    assert model.max_tokens == 4
    with pytest.raises(Exception, match="sliding_window = 4"):
        model(mx.array([IDS]))
    with pytest.raises(Exception, match="sliding_window = 4"):
        workbench.trace(model, IDS)


@pytest.mark.parametrize("case", sorted(OP_FAMILIES))
def test_op_level_logits_equal_torch(ckpts, case):
    ref = np.load(DATA / case / "logits.npy")
    model = workbench.load(ckpts[case], granularity="op", dtype="float32")
    out = np.array(model(mx.array([IDS])).astype(mx.float32))
    assert rel_err(out, ref) <= TOL, (case, rel_err(out, ref))


@pytest.mark.parametrize("case", ["llama", "qwen2_moe", "phi", "deepseek_v3", "gemma3_text", "mamba", "jamba"])
def test_a_trace_ends_in_torchs_logits(ckpts, case):
    ref = np.load(DATA / case / "logits.npy")
    model = workbench.load(ckpts[case], granularity="module")
    n = model.max_tokens or len(IDS)
    tr = workbench.trace(model, IDS[:n])
    tr.run()
    assert rel_err(np.array(tr.logits).reshape(ref[:, :n].shape), ref[:, :n]) <= TOL
    assert tr.first_nonfinite() is None


def _legacy(cfg: dict) -> dict:
    """The transformers 4.x form of a flat-RoPE config: rope_theta, partial_rotary_factor and
    rope_scaling at the top level, no rope_parameters."""
    cfg = copy.deepcopy(cfg)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    if "partial_rotary_factor" in rp:
        cfg["partial_rotary_factor"] = rp.pop("partial_rotary_factor")
    t = rp.pop("rope_type", "default")
    if t != "default":
        cfg["rope_scaling"] = {"type": t, "rope_type": t, **rp}
    return cfg


LEGACY = [c for c in CASES if c not in REFUSED and c not in WINDOWED
          and isinstance(json.loads((DATA / c / "config.json").read_text()).get("rope_parameters"), dict)
          and "rope_type" in json.loads((DATA / c / "config.json").read_text())["rope_parameters"]]


def with_config(ckpt: Path, dest: Path, edit) -> Path:
    """A checkpoint in ``dest``: ``ckpt``'s weights (linked) and ``edit(its config)``."""
    dest.mkdir()
    os.symlink(ckpt / "model.safetensors", dest / "model.safetensors")
    (dest / "config.json").write_text(json.dumps(edit(json.loads((ckpt / "config.json").read_text()))))
    return dest


@pytest.mark.parametrize("case", LEGACY)
def test_the_older_flat_form_gives_the_same_logits(ckpts, case, tmp_path):
    d = with_config(ckpts[case], tmp_path / case, _legacy)
    ref = np.load(DATA / case / "logits.npy")
    out = np.array(workbench.load(d, granularity="module")(mx.array([IDS])).astype(mx.float32))
    assert rel_err(out, ref) <= TOL, case


def _published_phi3(cfg: dict) -> dict:
    """The older form as Phi-3-mini-4k and Phi-3.5-mini publish it (transformers 4.40): no
    partial_rotary_factor at all (the original rotates every dimension)."""
    cfg = _legacy(cfg)
    assert cfg.pop("partial_rotary_factor") == 1.0
    return cfg


#: RoPE that mlx-lm computes otherwise than transformers (issue 40), corrected in
#: reference/corrections.py: YaRN with gpt-oss's "truncate": false, LongRoPE on a prompt under
#: original_max_position_embeddings (short_factor) and over it (long_factor); and Phi-3 in the
#: form it is published in, without partial_rotary_factor
ROPE_CASES = [("gpt_oss_yarn", None), ("phi3_longrope", None), ("phi3_longrope_long", None),
              ("phi3_4k", _published_phi3), ("phi3_longrope", _published_phi3)]


@pytest.mark.parametrize("case,form", ROPE_CASES, ids=[f"{c}-{'published' if f else 'v5'}" for c, f in ROPE_CASES])
def test_rope_mlx_lm_computes_otherwise_is_corrected_to_torchs_logits(ckpts, case, form, tmp_path):
    d = with_config(ckpts[case], tmp_path / case, form) if form else ckpts[case]
    ref = np.load(DATA / case / "logits.npy")
    model = workbench.load(d, granularity="module")
    assert model.max_tokens is None
    out = np.array(model(mx.array([IDS])).astype(mx.float32))
    assert rel_err(out, ref) <= 1e-5, (case, rel_err(out, ref))


def test_jambas_routing_is_corrected_to_torchs_logits(ckpts):
    """mlx-lm's Jamba takes the softmax over the top-k router logits (renormalising them);
    transformers over all experts, keeping the top-k weights as they are (issue 40: 0.26 of a
    logit uncorrected, 4 experts, top 2); corrected in reference/corrections.py."""
    cfg = json.loads((DATA / "jamba" / "config.json").read_text())
    assert (cfg["num_experts"], cfg["num_experts_per_tok"]) == (4, 2)
    ref = np.load(DATA / "jamba" / "logits.npy")
    model = workbench.load(ckpts["jamba"], granularity="module")
    assert model.max_tokens is None
    out = np.array(model(mx.array([IDS])).astype(mx.float32))
    assert rel_err(out, ref) <= 1e-5, rel_err(out, ref)


def test_longrope_switches_factors_where_transformers_does(ckpts):
    """The prompt (offset + new tokens) picks the factors: up to original_max_position_embeddings
    (8 here) the short ones, past it the long ones, for every position."""
    model = workbench.load(ckpts["phi3_longrope_long"], granularity="module")
    rope = next(m for _, m in model.module()[0].named_modules() if hasattr(m, "_short_freqs"))
    x = mx.ones((1, 1, 8, 16))
    rot = lambda f, off=0: mx.fast.rope(x * rope._scale, 16, traditional=False, base=None, scale=1.0,  # noqa: E731
                                        offset=off, freqs=f)
    assert mx.allclose(rope(x), rot(rope._short_freqs))
    assert mx.allclose(rope(x, offset=1), rot(rope._freqs, 1))


def test_yarn_truncate_false_where_mlx_lm_has_its_own_yarn_is_refused_by_name(ckpts, tmp_path):
    # (mlx-lm's deepseek_v2 computes YaRN itself, always truncating)
    edit = lambda c: dict(c, rope_parameters=dict(c["rope_parameters"], truncate=False))  # noqa: E731
    d = with_config(ckpts["deepseek_v2"], tmp_path / "ds", edit)
    with pytest.raises(ValueError, match="rope_scaling.truncate = False, which mlx-lm's deepseek_v2 does not read"):
        workbench.load(d, granularity="module")


def test_rope_parameters_and_a_flat_key_that_disagree_are_refused(ckpts, tmp_path):
    d = with_config(ckpts["phi"], tmp_path / "phi", lambda c: dict(c, rope_theta=10000.0))  # rope_parameters: 5000
    with pytest.raises(ValueError, match="rope_theta = 10000.0 and rope_parameters.rope_theta = 5000.0 disagree"):
        workbench.load(d, granularity="module")


def test_an_unread_key_off_its_default_is_refused_by_name(ckpts, tmp_path):
    # (mlx-lm's qwen2 reads no sliding window at all)
    d = with_config(ckpts["qwen2"], tmp_path / "q", lambda c: dict(c, use_sliding_window=True))
    with pytest.raises(ValueError, match="use_sliding_window = true is not read by mlx-lm's qwen2"):
        workbench.load(d, granularity="module")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_cannot_be_exact_is_one_line_and_exit_2(ckpts, case, capsys):
    with pytest.raises(Exception, match=REFUSED[case]):
        workbench.load(ckpts[case], granularity="module")
    capsys.readouterr()
    assert main(["hunt", str(ckpts[case]), "--ids", "3,17", "--json"]) == 2
    out, err = capsys.readouterr()
    assert REFUSED[case] in json.loads(out)["error"] and len(err.strip().splitlines()) == 1
    code = main(["inspect", str(ckpts[case]), "--json"])
    out, err = capsys.readouterr()
    if case == "olmo":  # the reference library cannot be used: unusable input, stdout stays JSON
        assert code == 2 and REFUSED[case] in json.loads(out)["error"]
    else:  # a config value the reference would compute wrongly: inspect's bad-config finding
        assert code == 1
        assert any(p["code"] == "bad-config" and REFUSED[case] in p["message"] for p in json.loads(out)["problems"])


def _mlx_lm_architectures():
    """(model_type, mlx-lm module) for every architecture both mlx-lm and transformers build."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = []
    for mt in sorted(CONFIG_MAPPING.keys()):
        fam = registry.lm_module(mt)
        if fam is not None and mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            out.append((mt, fam))
    return out


def test_every_field_mlx_lm_reads_is_given_filled_reviewed_or_refused():
    """For each architecture, transformers' own default config as it writes it: every field
    the mlx-lm family reads is in the normalised config, or a reviewed default, or the
    whole config is refused by name."""
    import logging
    import warnings
    from transformers import CONFIG_MAPPING

    archs = _mlx_lm_architectures()
    assert len(archs) >= 80
    refused, checked = {}, 0
    logging.getLogger("transformers").setLevel(logging.ERROR)
    for mt, fam in archs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = dict(CONFIG_MAPPING[mt]().to_dict(), model_type=mt)
        try:
            n = RC.normalise(cfg, "mlx_lm", fam)
        except (RC.ConfigError, registry.MissingExtra) as e:
            assert str(e) and "\n" not in str(e)
            refused[mt] = str(e)
            continue
        fields = RC.config_fields("mlx_lm", fam)
        if "text_config" in fields:
            tc = n.config.get("text_config") or {}
            tmt = tc.get("model_type", "") if isinstance(tc, dict) else ""
            inner = registry.lm_module(tmt)
            if inner is None:
                continue
            args = "TextConfig" if registry.WRAPPED_TEXT.get(tmt) == inner else "ModelArgs"
            fields, given, fam = RC.config_fields("mlx_lm", inner, args), tc, inner
        else:
            given = n.config
        ok = RC.REVIEWED_DEFAULTS["*"] | RC.REVIEWED_DEFAULTS.get(fam, frozenset())
        silent = {f for f in fields if f not in given and f not in ok and f not in ("model_type", "quantization",
                                                                                     "quantization_config")}
        assert not silent, (mt, sorted(silent))
        checked += 1
    assert checked >= 50, (checked, refused)
    # the known refusals say why in one line
    assert "partial_rotary_factor" in refused["glm"]
    assert "ai2-olmo" in refused["olmo"]


def test_a_gemma4_config_written_from_mlx_lms_model_args_opens_at_both_granularities(tmp_path):
    """Every field of mlx-lm's gemma4_text ModelArgs at its default (tiny sizes aside): keys it
    declares and ignores or reads at values with no effect are accepted, and both
    granularities compute the same logits."""
    from mlx_lm.models.gemma4_text import ModelArgs
    from workbench.zoo import reference as zr

    args = ModelArgs(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                     head_dim=16, global_head_dim=32, vocab_size=256, vocab_size_per_layer_input=256,
                     num_key_value_heads=2, num_kv_shared_layers=0, hidden_size_per_layer_input=8,
                     sliding_window=4, sliding_window_pattern=2)
    cfg = dataclasses.asdict(args)
    for k in ("global_partial_rotary_factor", "partial_rotary_factor", "rope_traditional"):
        assert k in cfg
    path = zr.write(tmp_path / "g4", cfg)
    ids = mx.array([IDS])
    op = np.array(workbench.load(path, granularity="op", dtype="float32")(ids))
    mod = np.array(workbench.load(path, granularity="module")(ids))
    assert rel_err(op, mod) <= 1e-5
    bad = dict(cfg, rope_traditional=True)  # a value with an effect the op program does not have
    (tmp_path / "g4" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="rope_traditional = True changes the numbers"):
        workbench.load(path, granularity="op")


def test_a_dtype_an_mlx_kernel_cannot_run_here_is_refused_before_running(ckpts, capsys):
    """Unquantized experts call gather_mm, which MLX's CPU backend runs in float32 only: a
    float16 hunt is one line naming the dtype that works (exit 2), not MLX's traceback."""
    code = main(["hunt", str(ckpts["qwen2_moe"]), "--ids", "3,17,42", "--dtype", "float16", "--json"])
    out, err = capsys.readouterr()
    if mx.default_device() != mx.cpu:  # (a GPU runs gather_mm in float16)
        assert code == 0
    else:
        assert code == 2
        assert "float32 only, not float16" in json.loads(out)["error"] and len(err.strip().splitlines()) == 1
    assert main(["hunt", str(ckpts["qwen2_moe"]), "--ids", "3,17,42", "--dtype", "float32", "--json"]) == 0
