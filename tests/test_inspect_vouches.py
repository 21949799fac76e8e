"""inspect = load on what it vouches for (issue 41, item 3).

The rule, checked over a corpus of checkpoints: ``workbench inspect`` says "OK" (exit 0)
exactly when ``workbench.load`` opens the checkpoint at the granularity it picks by itself
("auto": our op program where one exists, else the reference's modules, with mlx-vlm when
the config names towers).  So a config nothing builds -- a crafted or unknown
``model_type``, a field no reader accepts -- is a finding (exit 1, named), and so is a
checkpoint load would refuse for its towers or for want of a config.json; what load opens
is never reported broken.  Unusable input (exit 2) is unusable to both.

The corpus: the 46 architectures exactly as transformers 5 writes them (tests/data/archs)
and their older flat-RoPE forms, the configs of tests/data/configs and the number-changing
keys each refuses (tests/test_configs.py), the zoo (ours and mlx-lm's classes, quantized
too, Gemma 3n's stand-in towers), the multimodal builders, a PaliGemma that mlx-vlm opens
(a tower, projector or language-model tensor renamed or mis-shaped), the crafted model types
of last round (tests/test_trust_inputs.py) and more, broken variants of the demo's config,
and single-field edits that once split the two; then, as a hypothesis property, any one
field of a config set to any JSON value or removed.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workbench
import mlx.core as mx

from workbench import registry, zoo
from workbench.checkpoint.reader import CheckpointError
from workbench.cli import main
from workbench.device_memory import NotEnoughMemory
from workbench.zoo import reference as zr
from workbench.zoo.multimodal import build_gemma3, build_gemma4

from test_arch_refs import LEGACY, _legacy
from test_configs import REFUSED as CONFIG_REFUSED, _DELETE, _set, transformers_config, write as write_config_case
from test_trust_inputs import BAD_TYPES

sys.path.insert(0, str(Path(__file__).parent / "data"))
import make_arch_refs as refs  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"


# ----------------------------------------------------------------------------- builders
def _demo_with(edit):
    """A copy of the demo whose config.json is ``edit(config)`` (a dict edited in place when it
    returns None, else what it returns: another JSON value, or raw text)."""
    def build(dest: Path) -> Path:
        shutil.copytree(DEMO, dest)
        cfg = json.loads((dest / "config.json").read_text())
        out = edit(cfg)
        (dest / "config.json").write_text(out if isinstance(out, str) else json.dumps(cfg if out is None else out))
        return dest
    return build


def _set_key(key, value):
    return _demo_with(lambda c: c.__setitem__(key, value))


def _drop_key(key):
    return _demo_with(lambda c: c.pop(key) and None)


PALIGEMMA = {"model_type": "paligemma", "vocab_size": 256, "image_token_index": 255, "hidden_size": 64,
             "projection_dim": 64,
             "text_config": {"model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
                             "vocab_size": 256, "rope_theta": 10000.0, "max_position_embeddings": 512},
             "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 2, "hidden_size": 32,
                               "intermediate_size": 64, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                               "projection_dim": 64}}


def _rewrite(f: Path, edit) -> None:
    """Rewrite safetensors file ``f`` after ``edit(tensors)`` (name -> [header entry, bytes]),
    contiguously: the header stays sound whatever was dropped, renamed or reshaped."""
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    meta = hdr.pop("__metadata__", None)
    ts = {k: [v, data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in hdr.items()}
    edit(ts)
    out, blob, off = ({"__metadata__": meta} if meta else {}), [], 0
    for k, (v, b) in ts.items():
        out[k] = dict(v, data_offsets=[off, off + len(b)])
        blob.append(b)
        off += len(b)
    hb = json.dumps(out).encode()
    hb += b" " * (-len(hb) % 8)
    f.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(blob))


def _paligemma(edit=None):
    """A tiny PaliGemma (no op program, towers in the config: load opens it with mlx-vlm at module
    level) written from mlx-vlm's own model; ``edit(tensors)`` then changes its safetensors file."""
    def build(dest: Path) -> Path:
        from mlx.utils import tree_flatten

        from workbench.checkpoint.reference_arch import build_model

        dest.mkdir()
        mx.random.seed(0)
        _, _, model = build_model(copy.deepcopy(PALIGEMMA), "mlx_vlm", placeholders=False)
        f = dest / "model.safetensors"
        mx.save_safetensors(str(f), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"})
        (dest / "config.json").write_text(json.dumps(PALIGEMMA))
        if edit:
            _rewrite(f, edit)
        return dest
    return build


def _rename(old, new):
    return lambda ts: ts.__setitem__(new, ts.pop(old))


def _reshape(name, shape):  # (the same bytes, another shape of as many elements)
    return lambda ts: ts[name][0].__setitem__("shape", shape)


def _config_refusal(case, key, value):
    def build(dest: Path) -> Path:
        cfg = transformers_config(case)
        from test_configs import refs as config_refs

        w = config_refs.weights(transformers_config(case))
        _set(cfg, key, value if value is _DELETE else copy.deepcopy(value))
        return write_config_case(dest, cfg, w)
    return build


def _arch(case, legacy=False):
    def build(dest: Path) -> Path:
        p = refs.write_checkpoint(dest, refs.HERE / case)
        if legacy:
            (p / "config.json").write_text(json.dumps(_legacy(json.loads((p / "config.json").read_text()))))
        return p
    return build


def _edited(build, dotted: str, value):
    """``build``'s checkpoint with one config field (dotted path) set to ``value`` (or deleted)."""
    def make(dest: Path) -> Path:
        p = build(dest)
        cfg = json.loads((p / "config.json").read_text())
        _set(cfg, dotted, value)
        (p / "config.json").write_text(json.dumps(cfg))
        return p
    return make


#: single-field edits that once split inspect from load (found by the property below), each now
#: refused by both: (base name, its builder, field, value)
EDITED = [
    ("archs/gemma", _arch("gemma"), "hidden_activation", "bogus"),          # load's activation correction
    ("archs/gemma3n_text", _arch("gemma3n_text"), "rope_parameters.sliding_attention", [1]),  # table vs mlx-lm
    ("zoo-reference/gemma3n", lambda d: zr.build("gemma3n", d), "model_type", "default"),  # table by text_config
    ("archs/granite", _arch("granite"), "attention_multiplier", "x"),       # a wrong type load let through
    ("archs/mixtral", _arch("mixtral"), "num_experts_per_tok", {"a": 1}),
    ("archs/gemma", _arch("gemma"), "rms_norm_eps", 10**12),
    ("archs/phi3", _arch("phi3"), "max_position_embeddings", True),
]


def _config_case(case):
    return lambda dest: write_config_case(dest, transformers_config(case))


def _broken_tokenizer(dest: Path) -> Path:
    shutil.copytree(DEMO, dest)
    (dest / "tokenizer.json").write_text('{"not": "a tokenizer"')
    return dest


def _lone_file(dest: Path) -> Path:
    dest.mkdir()
    shutil.copy(DEMO / "model.safetensors", dest / "w.safetensors")
    return dest / "w.safetensors"


#: model types crafted last round (tests/test_trust_inputs.py) and more: module paths, names of
#: no model, case and space variants, families of no language model, towers alone
CRAFTED_TYPES = list(BAD_TYPES) + ["qwen9", "no_such_model", "x", "Llama", "LLAMA", "llama ", " llama", "llama\t",
                                   "llama/../qwen3", "../../etc/passwd", "bert", "t5", "whisper", "clip", "siglip",
                                   "idefics3", "mllama", "utils", "models", "__main__", "sys", "os", "gemma4_vision",
                                   "gemma3n_audio", "\u0131lama", "ll\u0430ma"]

#: broken variants of the demo's config: (name, build, expected verdict of both) -- "ok" or "refused"
BROKEN = [
    ("no model_type", _drop_key("model_type"), "refused"),
    ("no num_hidden_layers", _drop_key("num_hidden_layers"), "refused"),
    ("no hidden_size", _drop_key("hidden_size"), "refused"),
    ("no vocab_size", _drop_key("vocab_size"), "refused"),
    ("num_attention_heads 0", _set_key("num_attention_heads", 0), "refused"),
    ("num_hidden_layers 0", _set_key("num_hidden_layers", 0), "refused"),
    ("num_hidden_layers -1", _set_key("num_hidden_layers", -1), "refused"),
    ("num_hidden_layers '4'", _set_key("num_hidden_layers", "4"), "refused"),
    ("num_hidden_layers 4.5", _set_key("num_hidden_layers", 4.5), "refused"),
    ("num_hidden_layers 1e9", _set_key("num_hidden_layers", 10**9), "refused"),
    ("num_hidden_layers true", _set_key("num_hidden_layers", True), "refused"),
    ("hidden_size off", _set_key("hidden_size", 64), "refused"),
    ("vocab_size off", _set_key("vocab_size", 100), "refused"),
    ("num_key_value_heads 3", _set_key("num_key_value_heads", 3), "refused"),
    ("head_dim odd", _set_key("head_dim", 7), "refused"),
    ("rms_norm_eps -1", _set_key("rms_norm_eps", -1.0), "refused"),
    ("rms_norm_eps 'a'", _set_key("rms_norm_eps", "a"), "refused"),
    ("rms_norm_eps NaN", _demo_with(lambda c: json.dumps(c).replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN')),
     "refused"),
    ("tie_word_embeddings 'yes'", _set_key("tie_word_embeddings", "yes"), "refused"),
    ("layer_types bogus", _set_key("layer_types", ["x"] * 4), "refused"),
    ("unknown key", _set_key("frobnicate", 3), "refused"),
    ("logit_scale", _set_key("logit_scale", 0.5), "refused"),
    ("hidden_act relu", _set_key("hidden_act", "relu"), "refused"),
    ("rope_scaling bogus", _set_key("rope_scaling", {"type": "bogus", "factor": 2}), "refused"),
    ("text_config a list", _set_key("text_config", [1]), "refused"),
    ("text_config empty", _set_key("text_config", {}), "refused"),
    ("vision_config empty", _set_key("vision_config", {}), "refused"),
    ("another family's keys (qwen3)", _set_key("model_type", "qwen3"), "refused"),
    ("another family's keys (phi3)", _set_key("model_type", "phi3"), "refused"),
    ("another family's keys (gpt2)", _set_key("model_type", "gpt2"), "refused"),
    ("a wrapper's type (gemma3)", _set_key("model_type", "gemma3"), "refused"),
    ("a tower-only family (llava)", _set_key("model_type", "llava"), "refused"),
    ("config a list", _demo_with(lambda c: [c]), "refused"),
    ("config null", _demo_with(lambda c: "null"), "refused"),
    ("config not JSON", _demo_with(lambda c: "{"), "refused"),
    ("config empty", _demo_with(lambda c: ""), "refused"),
    ("config nested deep", _demo_with(lambda c: "[" * 100_000 + "]" * 100_000), "refused"),
    ("no config.json, a lone file", _lone_file, "refused"),
    # what load opens, inspect must not call broken
    ("gemma4 wrapper type on a text config", _set_key("model_type", "gemma4"), "ok"),
    ("sliding_window 2", _set_key("sliding_window", 2), "ok"),
    ("quantization block, float weights", _set_key("quantization", {"bits": 3, "group_size": 7}), "ok"),
    ("tokenizer.json unparseable", _broken_tokenizer, "ok"),
]

#: the architectures that do not load (tests/test_inspect_load.py): refused by both
ARCHS_REFUSED = {"glm", "olmo"}

#: (name, build, expected verdict) -- expected None: only the rule is checked
CORPUS: list[tuple[str, object, str | None]] = []
CORPUS += [(f"archs/{c}", _arch(c), "refused" if c in ARCHS_REFUSED else "ok") for c in sorted(refs.CASES)]
CORPUS += [(f"archs-4.x/{c}", _arch(c, legacy=True), "ok") for c in LEGACY]
CORPUS += [(f"configs/{c}", _config_case(c), "ok") for c in sorted(p.name for p in (refs.HERE.parent / "configs").iterdir()
                                                                       if p.is_dir())]
CORPUS += [(f"configs-refused/{c}:{k}={'<deleted>' if v is _DELETE else repr(v)}"[:90], _config_refusal(c, k, v),
            "refused") for c, k, v, _ in CONFIG_REFUSED]
CORPUS += [(f"zoo/{a}", (lambda a: lambda d: zoo.build(a, d))(a), "ok") for a in zoo.ARCHS]
CORPUS += [(f"zoo/{a}-{q}", (lambda a, q: lambda d: zoo.build(a, d, quant=q))(a, q), "ok")
           for a, q in (("qwen3", "affine4"), ("gemma4", "mxfp4"), ("llama", "nvfp4"), ("gemma3_text", "mxfp8"))]
CORPUS += [(f"zoo/{a} (stand-in towers)", (lambda a: lambda d: zoo.build(a, d))(a), "refused")
           for a in zoo.INSPECT_ONLY_ARCHS]
CORPUS += [(f"zoo-reference/{a}", (lambda a: lambda d: zr.build(a, d))(a), "ok") for a in zr.ARCHS]
CORPUS += [("zoo-reference/qwen2-affine4", lambda d: zr.build("qwen2", d, quant="affine4"), "ok")]
CORPUS += [("multimodal/gemma4", build_gemma4, "ok"),
           # (auto opens Gemma 3 with our op program, which refuses the wrapper's mm_tokens_per_image)
           ("multimodal/gemma3", build_gemma3, "refused")]
CORPUS += [("mlx-vlm/paligemma", _paligemma(), "ok"),
           ("mlx-vlm/paligemma tower tensor renamed", _paligemma(_rename(
               "vision_tower.vision_model.post_layernorm.weight", "vision_tower.vision_model.post_layernorm.wt")),
            "refused"),
           ("mlx-vlm/paligemma tower tensor mis-shaped", _paligemma(_reshape(
               "vision_tower.vision_model.post_layernorm.weight", [16, 2])), "refused"),
           ("mlx-vlm/paligemma projector renamed", _paligemma(_rename(
               "multi_modal_projector.linear.weight", "multi_modal_projector.lin.weight")), "refused"),
           ("mlx-vlm/paligemma language model tensor renamed", _paligemma(_rename(
               "language_model.model.layers.1.mlp.up_proj.weight", "language_model.model.layers.1.mlp.up_prj.weight")),
            "refused")]
CORPUS += [(f"edited/{n}:{k}={v!r}", _edited(b, k, v), "refused") for n, b, k, v in EDITED]
CORPUS += [(f"model_type={mt!r}"[:90], _set_key("model_type", mt), "refused") for mt in CRAFTED_TYPES]
CORPUS += [(f"broken/{n}", b, want) for n, b, want in BROKEN]
NAMES = [n for n, _, _ in CORPUS]
assert len(set(NAMES)) == len(NAMES), [n for n in NAMES if NAMES.count(n) > 1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("vouches")
    made = {}

    def get(i: int) -> Path:
        if i not in made:
            made[i] = CORPUS[i][1](root / f"c{i}")
        return made[i]
    return get


def inspect_verdict(p):
    """("ok" | "findings" | "unusable", report or exception)."""
    try:
        r = workbench.inspect(p)
    except (CheckpointError, registry.MissingExtra) as e:
        return "unusable", e
    return ("ok" if r.ok else "findings"), r


def load_verdict(p):
    """("loads" | "refused", model or exception), at the granularity load picks by itself."""
    try:
        return "loads", workbench.load(p)
    except NotEnoughMemory as e:  # (not the checkpoint's fault: the corpus is tiny)
        pytest.fail(f"the machine has too little memory for this test: {e}")
    except Exception as e:  # noqa: BLE001 - any refusal is the finding
        return "refused", e


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=NAMES)
def test_inspect_vouches_exactly_for_what_load_opens(built, i):
    name, _, want = CORPUS[i]
    p = built(i)
    ins, r = inspect_verdict(p)
    ld, m = load_verdict(p)
    why = f"{name}: inspect {ins} ({r if ins == 'unusable' else [e.message for e in r.errors][:3]}), " \
          f"load {ld} ({type(m).__name__}: {m if ld == 'refused' else ''})"
    # the rule, both ways: OK only for what loads; a refusal is never OK, and no false alarm either
    assert (ins == "ok") == (ld == "loads"), why
    if ld == "refused":
        assert "\n" not in str(m).strip() and str(m).strip(), why  # one line, never empty
    if ins == "unusable":  # (exit 2 for both)
        assert isinstance(m, (CheckpointError, registry.MissingExtra)) or "olmo" in name, why
    elif ins == "findings":
        assert r.errors and all(e.message.strip() and "\n" not in e.message for e in r.errors), why
    if want is not None:
        assert ld == ("loads" if want == "ok" else "refused"), why


@pytest.mark.parametrize("mt", CRAFTED_TYPES, ids=[repr(m)[:40] for m in CRAFTED_TYPES])
def test_a_model_type_nothing_builds_is_an_error(built, mt):
    """The repro: a model_type nothing builds is a bad-config error naming it, never a warning."""
    i = NAMES.index(f"model_type={mt!r}"[:90])
    r = workbench.inspect(built(i))
    assert not r.ok
    (bad,) = [p for p in r.problems if p.code == "bad-config"]
    assert bad.severity == "error" and bad.file == "config.json"
    assert f"model_type {mt!r} is not a supported family" in bad.message, bad.message


def test_the_repro_exits_1_naming_the_finding(tmp_path, capsys):
    """issue 41: `"model_type": ".."` gave one warning and "OK: no errors", exit 0."""
    d = _set_key("model_type", "..")(tmp_path / "x")
    assert main(["inspect", str(d)]) == 1
    out = capsys.readouterr().out
    assert "OK" not in out and "FAILED: 1 error(s)" in out
    (line,) = [ln for ln in out.splitlines() if "bad-config" in ln]
    assert line.split()[0] == "error" and "model_type '..' is not a supported family" in line
    assert main(["inspect", str(d), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False and [(p["code"], p["severity"]) for p in d["problems"]] == [("bad-config", "error")]


def test_the_corpus_is_not_vacuous():
    """Both sides of the rule are exercised, on every kind of case."""
    wants = [w for _, _, w in CORPUS]
    assert wants.count("ok") >= 100 and wants.count("refused") >= 100
    kinds = {n.split("/")[0].split("=")[0] for n in NAMES}
    assert {"archs", "archs-4.x", "configs", "configs-refused", "zoo", "zoo-reference", "multimodal", "mlx-vlm",
            "model_type", "broken", "edited"} <= kinds


#: the checkpoints the property below mutates: one of each kind of reader (op program, table
#: at module level, reference parameters with and without sanitize conversions, mlx-vlm towers)
MUTATED = ["archs/llama", "archs/gemma3n_text", "archs/qwen2_moe", "archs/deepseek_v3", "archs/gpt2", "archs/mamba",
           "archs/gemma", "archs/phi3", "archs/granitemoe", "zoo/gemma4", "zoo/qwen3", "zoo-reference/gemma3n",
           "zoo-reference/gpt_oss", "multimodal/gemma4", "mlx-vlm/paligemma", "broken/sliding_window 2"]
_VALUES = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 7, 1.5, 0.0, -0.5, 1e9, 10**12, 2**31, True, False, None, "",
                                     "x", "gelu", "silu", "default", "linear", "sliding_attention", [], [1],
                                     ["full_attention"], {}, {"a": 1}, {"rope_type": "yarn"}]),
                    st.integers(-2**40, 2**40), st.floats(allow_nan=False, width=32), st.text(max_size=4))


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_one_field_changed_anywhere_keeps_inspect_equal_to_load(built, tmp_path_factory, data):
    """The rule as a property: any one field of a config (nested ones too) set to any JSON value
    or removed, on checkpoints of every reader -- inspect says OK exactly when load opens it."""
    name = data.draw(st.sampled_from(MUTATED))
    src = built(NAMES.index(name))
    cfg = json.loads((src / "config.json").read_text())
    d, path = cfg, []
    while isinstance(d, dict) and d:
        k = data.draw(st.sampled_from(sorted(d)))
        path.append(k)
        if not (isinstance(d[k], dict) and d[k] and data.draw(st.booleans())):
            break
        d = d[k]
    if not path:
        return
    value = data.draw(st.one_of(st.just(_DELETE), _VALUES))
    if value is _DELETE:
        d.pop(path[-1])
    else:
        d[path[-1]] = value
    q = tmp_path_factory.mktemp("mut")
    for f in src.iterdir():
        if f.name != "config.json":
            os.symlink(f, q / f.name)
    (q / "config.json").write_text(json.dumps(cfg))
    ins, r = inspect_verdict(q)
    ld, m = load_verdict(q)
    why = f"{name}: {'.'.join(map(str, path))} = {value!r}: inspect {ins} " \
          f"({[e.message for e in r.errors][:2] if ins == 'findings' else r if ins == 'unusable' else ''}), load {ld} " \
          f"({type(m).__name__}: {m if ld == 'refused' else ''})"
    assert (ins == "ok") == (ld == "loads"), why
    if ld == "refused":
        assert "\n" not in str(m).strip() and str(m).strip(), why
    shutil.rmtree(q)


def test_an_unreadable_tokenizer_is_named_by_both(tmp_path, capsys):
    """tokenizer.json the tokenizers library cannot read: load opens the model without it and
    inspect warns (both read it alike); a prompt is then refused in one line naming the file."""
    d = _broken_tokenizer(tmp_path / "ck")
    r = workbench.inspect(d)
    (w,) = r.problems
    assert r.ok and (w.code, w.severity, w.file) == ("bad-config", "warning", "tokenizer.json")
    assert w.message.startswith("tokenizer.json cannot be read by the tokenizers library")
    m = workbench.load(d)
    assert m.tokenizer is None
    with pytest.raises(ValueError, match="tokenizer.json cannot be read"):
        m.encode("hi")
    assert main(["hunt", str(d), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer.json cannot be read" in err and "--ids" in err
    assert main(["hunt", str(d), "--ids", "1,2"]) == 0


def test_towers_are_checked_only_where_load_reads_them(built, tmp_path):
    """Gemma 4 with towers opens as an op program, which never reads them: a tower tensor
    dropped leaves it loadable and inspect vouches for it.  The PaliGemma opens with mlx-vlm,
    which loads its towers strictly: they are checked tensor by tensor, each named."""
    p = build_gemma4(tmp_path / "g4")
    gone = "vision_tower.patch_embedder.position_embedding_table"
    (f,) = [f for f in p.glob("*.safetensors") if gone.encode() in f.read_bytes()[:1 << 20]]
    _rewrite(f, lambda ts: ts.pop(gone))
    assert workbench.inspect(p).ok and workbench.load(p).granularity == "op"
    with pytest.raises(ValueError, match=f"Missing 1 parameters: {gone}"):  # (what module level would say)
        workbench.load(p, granularity="module")
    r = workbench.inspect(built(NAMES.index("mlx-vlm/paligemma tower tensor renamed")))
    got = sorted((e.code, e.tensor) for e in r.errors)
    assert got == [("missing-tensor", "vision_tower.vision_model.post_layernorm.weight"),
                   ("unexpected-tensor", "vision_tower.vision_model.post_layernorm.wt")], got
    r = workbench.inspect(built(NAMES.index("mlx-vlm/paligemma tower tensor mis-shaped")))
    assert [(e.code, e.tensor) for e in r.errors] == [("shape-mismatch",
                                                       "vision_tower.vision_model.post_layernorm.weight")]
    assert "expected [32]" in r.errors[0].message
    r = workbench.inspect(built(NAMES.index("mlx-vlm/paligemma projector renamed")))
    assert sorted((e.code, e.tensor) for e in r.errors) == [
        ("missing-tensor", "multi_modal_projector.linear.weight"),
        ("unexpected-tensor", "multi_modal_projector.lin.weight")]
