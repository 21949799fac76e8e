"""Module-level tracing of mlx-lm architectures we have no op program for (issue 10).

Every architecture of the reference zoo (workbench.zoo.reference: tiny random
checkpoints built from mlx-lm's own classes, dense and mixture-of-experts) is opened
with ``workbench.load(p, granularity="module")`` and traced; mlx-lm's own forward is
the reference.  For our four op-program families, the two granularities are compared
at every step name they share.
"""
import json
import shutil
import subprocess
import sys

import pytest

import workbench
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

import models_tiny as mt
from workbench import registry
from workbench.trace.modules import ModuleTrace
from workbench.zoo import reference as zr

ARCHS = list(zr.ARCHS)
IDS = mx.array([[2, 15, 16, 40, 77, 100, 130, 255]])
IDS_ARG = ",".join(str(i) for i in IDS[0].tolist())

#: module of layer 1 given a NaN weight element (expert weights for MoE: every expert's)
NAN_AT = {"phi": "layers.1.mlp.fc2", "starcoder2": "layers.1.mlp.c_proj",
          "mixtral": "layers.1.block_sparse_moe.switch_mlp.down_proj",
          "qwen3_moe": "layers.1.mlp.switch_mlp.down_proj", "qwen2_moe": "layers.1.mlp.switch_mlp.down_proj",
          "olmoe": "layers.1.mlp.switch_mlp.down_proj", "gpt_oss": "layers.1.mlp.experts.down_proj",
          "deepseek_v3": "layers.1.mlp.switch_mlp.down_proj"}
#: the norm of layer 1 whose weight is raised to 60000: finite in float16, its output is not
OVERFLOW_AT = {"olmo2": "layers.1.post_attention_layernorm"}
LM_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")


def step_of(path: str) -> str:
    """The step name the issue specifies for a module path: language-model prefix stripped."""
    for pre in LM_PREFIXES:
        if path.startswith(pre):
            return path[len(pre):]
    return path


def base(name: str) -> str:
    return name.split("#")[0]


def f32(x):
    return x.astype(mx.float32)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Checkpoints of the reference zoo, built once per (arch, dtype, quant)."""
    made = {}

    def get(arch, dtype=None, quant=None):
        key = (arch, dtype, quant)
        if key not in made:
            made[key] = zr.build(arch, tmp_path_factory.mktemp(arch), dtype=dtype, quant=quant)
        return made[key]
    return get


def trace(path, dtype=None, capture="stats"):
    t = workbench.trace(workbench.load(path, granularity="module"), IDS, capture=capture, dtype=dtype)
    t.run()
    return t


def planted(src, dest, module: str, edit):
    """A copy of checkpoint ``src`` whose tensor ``<module>.weight`` is ``edit(weight)``."""
    shutil.copytree(src, dest)
    w = mx.load(str(dest / "model.safetensors"))
    keys = [k for k in w if step_of(k) == module + ".weight"]
    assert len(keys) == 1, f"{module}.weight in {sorted(w)}"
    w[keys[0]] = edit(w[keys[0]])
    mx.save_safetensors(str(dest / "model.safetensors"), w, metadata={"format": "mlx"})
    return dest


# ------------------------------------------------------------------ the zoo itself
def test_zoo_has_twelve_architectures_beyond_our_four_including_moe():
    ours = {"llama", "qwen3", "gemma3_text", "gemma4_text"}
    assert len(set(ARCHS) - ours) >= 12
    assert {"mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "phi3", "mistral", "olmo2", "starcoder2",
            "gemma3n"} <= set(ARCHS)
    assert set(zr.MOE) <= set(ARCHS) and len(zr.MOE) >= 4


def test_zoo_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown reference architecture 'nope'"):
        zr.build("nope", tmp_path / "a")
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        zr.build("qwen2", tmp_path / "b", quant="int3")
    with pytest.raises(ValueError, match="mlx-lm has no model 'nope'"):
        zr.write(tmp_path / "c", {"model_type": "nope"})


# ------------------------------------------------------------------ (a) logits
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_mlx_lm_bit_for_bit(ckpt, arch):
    p = ckpt(arch)
    cfg = json.loads((p / "config.json").read_text())
    if registry.op_family(cfg) is None:  # no op program: module level is the default
        assert workbench.load(p).granularity == "module"
    t = trace(p)
    ref = zr.reference(p)(IDS)
    got = t.value("logits")
    assert got.dtype == ref.dtype == mx.float32
    assert got.shape == ref.shape == (1, IDS.shape[1], 256)
    assert mx.array_equal(got, ref).item()
    assert t.program.names[-1] == "logits"


@pytest.mark.parametrize("arch,quant", [("phi3", None), ("gemma2", None), ("mixtral", "affine4")])
def test_logits_equal_mlx_lm_in_bfloat16(ckpt, arch, quant):
    p = ckpt(arch, "bfloat16", quant)
    t = trace(p)
    ref = zr.reference(p)(IDS)
    assert t.dtype == mx.bfloat16
    assert t.value("logits").dtype == ref.dtype == mx.bfloat16
    assert mx.array_equal(t.value("logits"), ref).item()


# ------------------------------------------------------------------ (b) every module is a step
def _called_leaves(model: nn.Module) -> tuple[dict, dict]:
    """Run mlx-lm's model once, counting calls of every leaf module object (our own
    wrapper, independent of the recorder): ``({id: calls}, {id: [step names of its paths]})``."""
    leaves = tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module))
    paths: dict[int, list[str]] = {}
    for path, m in leaves:
        paths.setdefault(id(m), []).append(step_of(path))
    calls = dict.fromkeys(paths, 0)
    classes = {}  # (mlx-lm's SwitchGLU default activation is one object in every model built)
    for _, m in leaves:
        if id(m) in classes:
            continue
        classes[id(m)] = (m, type(m))

        def counted(self, *a, _orig=type(m).__call__, **k):
            calls[id(self)] += 1
            return _orig(self, *a, **k)
        m.__class__ = type(type(m).__name__, (type(m),), {"__call__": counted})
    try:
        mx.eval(model(IDS))
    finally:
        for m, cls in classes.values():
            m.__class__ = cls
    return calls, paths


@pytest.mark.parametrize("arch", ARCHS)
def test_every_called_leaf_module_is_a_step(ckpt, arch):
    p = ckpt(arch)
    t = trace(p)
    names = t.program.names
    steps = {}
    for n in names:
        steps[base(n)] = steps.get(base(n), 0) + 1
    calls, paths = _called_leaves(zr.reference(p))
    kinds = set()
    for mid, n in calls.items():
        got = sum(steps.get(s, 0) for s in paths[mid])
        assert got == n, f"{arch}: {paths[mid]} called {n} times, {got} steps"
        if n and len(paths[mid]) == 1:
            name = paths[mid][0]
            assert name in steps, f"{arch}: leaf {name} is not a step"
            assert [x for x in names if base(x) == name] == [name] + [f"{name}#{k}" for k in range(2, n + 1)]
    model = zr.reference(p)
    for path, m in model.named_modules():  # every Linear / Embedding / norm leaf that exists
        if not path or any(True for _ in tree_flatten(m.children(), is_leaf=lambda x: isinstance(x, nn.Module))):
            continue
        kind = type(m).__name__
        if kind.endswith(("Linear", "Embedding")) or "Norm" in kind:
            kinds.add(kind)
            assert step_of(path) in steps, f"{arch}: {kind} {path} is not a step"
    assert {"Linear", "Embedding"} & kinds and any("Norm" in k for k in kinds)
    # a module shared between layers (mlx-lm's SwitchGLU default activation) is named
    # after the layer that called it, once per layer
    for mid, ps in paths.items():
        if len(ps) > 1:
            assert all(steps.get(s) == 1 for s in ps), (arch, ps, [steps.get(s) for s in ps])
    n_layers = zr.ARCHS[arch].get("text_config", zr.ARCHS[arch])["num_hidden_layers"]
    assert [n for n in names if n.startswith("layers.") and n.count(".") == 1] == [
        f"layers.{i}" for i in range(n_layers)]  # each decoder layer's output, in order
    assert "embed_tokens" in steps and names[-1] == "logits"


# ------------------------------------------------------------------ (c) a planted NaN weight
@pytest.mark.parametrize("arch", ARCHS)
def test_planted_nan_weight_is_found_at_its_module(ckpt, arch, tmp_path):
    at = NAN_AT.get(arch, "layers.1.mlp.down_proj")

    def nan(w):
        w[..., 0, 0] = float("nan")  # one element (of every expert, for an expert tensor)
        return w
    p = planted(ckpt(arch), tmp_path / "nan", at, nan)
    t = workbench.trace(workbench.load(p, granularity="module"), IDS)
    f = t.first_nonfinite()
    assert f is not None, f"{arch}: no non-finite step found"
    assert (f.op, f.layer, f.cause) == (at, 1, "nonfinite-weight")
    assert f"{at}.weight" in f.detail
    assert not any(d["nan"] for d in f.inputs)


# ------------------------------------------------------------------ (d) a planted float16 overflow
@pytest.mark.parametrize("arch", ARCHS)
def test_planted_float16_overflow_is_found(ckpt, arch, tmp_path):
    # mixture-of-experts checkpoints are 8-bit quantized here: MLX's CPU gather_mm (float
    # experts) computes in float32 only, gather_qmm (quantized experts) in float16 too
    src = ckpt(arch, None, "affine8" if arch in zr.MOE else None)
    at = OVERFLOW_AT.get(arch, "layers.1.input_layernorm")
    p = planted(src, tmp_path / "ovf", at, lambda w: mx.full(w.shape, 60000.0, w.dtype))
    m = workbench.load(p, granularity="module")
    clean32 = workbench.trace(m, IDS)
    assert clean32.first_nonfinite() is None  # finite in float32 ...
    assert clean32.value(at).abs().max().item() > 65504
    t = workbench.trace(m, IDS, dtype="float16")  # ... and not in float16
    f = t.first_nonfinite()
    assert f is not None, f"{arch}: no non-finite step in float16"
    assert (f.op, f.layer, f.cause) == (at, 1, "overflow")
    assert f.posinf + f.neginf > 0
    assert 65504 < f.float32_absmax < 1e7


# ------------------------------------------------------------------ (e) the CLI
def _cli(*args):
    """``workbench ARGS`` in a fresh interpreter: (exit status, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "workbench.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=180)
    return r.returncode, r.stdout, r.stderr


def _main(capsys, *args):
    """``workbench ARGS`` in this process (cheaper): (exit status, stdout, stderr)."""
    from workbench.cli import main

    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_hunt_and_dump_on_a_module_level_checkpoint(ckpt, tmp_path, capsys):
    clean = ckpt("mixtral")
    names = trace(clean).program.names
    bad = planted(clean, tmp_path / "nan", NAN_AT["mixtral"], lambda w: w * float("nan"))
    rc, out, err = _cli("hunt", bad, "--ids", IDS_ARG, "--json")
    assert rc == 1, err
    f = json.loads(out)["first_nonfinite"]
    assert (f["op"], f["cause"], f["layer"]) == (NAN_AT["mixtral"], "nonfinite-weight", 1)
    rc, out, err = _main(capsys, "hunt", clean, "--prompt", "the cat sat on the mat", "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["first_nonfinite"] is None and rep["ops_checked"] == len(names)
    rc, out, err = _main(capsys, "hunt", clean, "--ids", "1,2,999", "--json")
    assert rc == 2 and "999" in err and len(err.strip().splitlines()) == 1

    dump = tmp_path / "dump.safetensors"
    rc, out, err = _cli("dump", clean, "--ids", IDS_ARG, "--out", dump, "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["names"] == names and summary["ops"] == len(names)
    dumped = mx.load(str(dump))
    assert mx.array_equal(dumped["logits"], zr.reference(clean)(IDS)).item()
    moe = NAN_AT["mixtral"]
    assert mx.array_equal(dumped[moe], trace(clean, capture="full").value(moe)).item()
    rc, out, err = _main(capsys, "dump", tmp_path / "nowhere", "--ids", IDS_ARG, "--out", tmp_path / "x.safetensors",
                         "--json")
    assert rc == 2 and "nowhere" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ op program vs module level
FAMILIES = ("llama", "qwen3", "gemma3_text", "gemma4_text")


@pytest.mark.parametrize("family", FAMILIES)
def test_op_and_module_granularity_agree_at_shared_names(family, tmp_path):
    p = mt.build(tmp_path / family, mt.CONFIGS[family])
    op = workbench.trace(workbench.load(p), IDS, capture="full")
    mod = workbench.trace(workbench.load(p, granularity="module"), IDS, capture="full")
    assert not isinstance(op, ModuleTrace) and isinstance(mod, ModuleTrace)
    op.run()
    mod.run()
    ops = set(op.program.names)
    shared = [n for n in mod.program.names if n in ops]
    compared = []
    for n in shared:
        a, b = f32(op.value(n)), f32(mod.value(n))
        if a.shape != b.shape and a.ndim == 4 and a.swapaxes(1, 2).shape == b.shape:
            a = a.swapaxes(1, 2)  # per-head norms: [B, H, T, D] in our program, [B, T, H, D] in mlx-lm
        if a.shape != b.shape:
            continue
        rel = (mx.abs(a - b).max() / mx.maximum(mx.abs(b).max(), 1e-30)).item()
        assert rel <= 1e-5, f"{family}: {n} differs by {rel:.3g} relative"
        compared.append(n)
    n_layers = mt.CONFIGS[family]["num_hidden_layers"]
    must = {"embed_tokens", "norm", "logits"}
    for i in range(n_layers):
        must |= {f"layers.{i}", f"layers.{i}.input_layernorm", f"layers.{i}.post_attention_layernorm",
                 f"layers.{i}.mlp.down_proj", f"layers.{i}.mlp.up_proj", f"layers.{i}.mlp.gate_proj",
                 f"layers.{i}.self_attn.q_proj", f"layers.{i}.self_attn.o_proj"}
        if i < n_layers - mt.CONFIGS[family].get("num_kv_shared_layers", 0):  # shared layers have no k/v
            must |= {f"layers.{i}.self_attn.k_proj", f"layers.{i}.self_attn.v_proj"}
        if family != "llama":
            must |= {f"layers.{i}.self_attn.q_norm"}
    assert must <= set(compared), sorted(must - set(compared))
    assert len(compared) >= 12 * n_layers
