"""Real-shaped configurations (workbench/zoo/real_shapes.py): the published config.json of
Gemma 4 E2B / E4B / 26B-A4B / 31B and Gemma 3 12B read by our strict reader, header-only
checkpoints of every shape inspected clean at full size, and a layer-cut random E2B at
real widths traced to exactly mlx-lm's logits."""
import json

import mlx.core as mx
import pytest

import workbench
from workbench.checkpoint.arch import build_arch
from workbench.checkpoint.reader import open_checkpoint
from workbench.cli import main
from workbench import zoo
from workbench.zoo import real_shapes as rs


def test_configs_parse_with_the_strict_reader_in_both_forms():
    for name in rs.NAMES:
        pub, new = build_arch(rs.config(name)), build_arch(rs.config(name, form="transformers"))
        assert pub.spec == new.spec, name  # flat global_head_dim vs per_layer_config: one model
        assert {k: e.shape for k, e in pub.expected.items()} == {k: e.shape for k, e in new.expected.items()}
        assert "global_head_dim" not in rs.config(name, form="transformers")["text_config"]
    e2b = build_arch(rs.config("e2b")).spec
    assert (e2b.num_hidden_layers, e2b.hidden_size, e2b.num_kv_shared_layers) == (35, 1536, 20)
    assert e2b.layer_types[:5] == ["sliding_attention"] * 4 + ["full_attention"]
    assert e2b.head_dims[4] == 512 and e2b.head_dims[0] == 256 and e2b.kv_heads[4] == 1
    moe = build_arch(rs.config("26b-a4b"))
    assert moe.moe == {"num_experts": 128, "top_k": 8, "moe_intermediate_size": 704}
    assert moe.spec.kv_heads[5] == 2 and moe.spec.kv_heads[0] == 8  # k_eq_v full layers: 2 KV heads
    g3 = build_arch(rs.config("gemma3-12b")).spec
    assert g3.rope["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    assert (g3.vocab_size, g3.layer_types[5], g3.layer_types[4]) == (262208, "full_attention",
                                                                             "sliding_attention")


def test_sizes_are_the_measured_checkpoints():
    """The issue's measured random checkpoints: E2B bf16 9.3 GB, 26B-A4B 4-bit 14.2 GB, 31B 4-bit 17.3 GB."""
    assert round(rs.nbytes("e2b") / 1e9, 1) == 9.3
    assert round(rs.nbytes("26b-a4b", quant="affine4") / 1e9, 1) == 14.2
    assert round(rs.nbytes("31b", quant="affine4") / 1e9, 1) == 17.3


def test_cut_keeps_every_feature_and_refuses_nonsense():
    tc = rs.config("e2b", layers=6, vocab_size=2048)["text_config"]
    assert tc["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"] * 2
    assert tc["num_kv_shared_layers"] == 1 and tc["vocab_size_per_layer_input"] == 2048
    a = build_arch(rs.config("e2b", layers=6, vocab_size=2048))
    assert a.expected["layers.5.mlp.gate_proj.weight"].shape == (2 * 6144, 1536)  # double-wide shared layer
    assert rs.config("31b", layers=3)["text_config"]["layer_types"][-1] == "full_attention"
    assert rs.config("gemma3-12b", layers=2)["text_config"]["num_hidden_layers"] == 2
    for bad in (0, 36, True, "3"):
        with pytest.raises(ValueError, match="layers must be"):
            rs.config("e2b", layers=bad)
    with pytest.raises(ValueError, match="unknown real shape"):
        rs.config("e3b")
    with pytest.raises(ValueError, match="unknown quantization"):
        rs.build_header_only("e2b", "/nonexistent", quant="int3")
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):  # never silently unquantized
        zoo.build_sparse("/nonexistent", quant="int3")


@pytest.mark.parametrize("quant", [None, "affine4", "mxfp4"])
def test_header_only_full_size_inspect_clean(tmp_path, capsys, quant):
    for name in rs.NAMES:
        p = rs.build_header_only(name, tmp_path / f"{name}-{quant}", quant=quant)
        assert sum(f.stat().st_blocks * 512 for f in p.glob("*.safetensors")) < 50e6  # holes, not data
        assert main(["inspect", str(p), "--json"]) == 0, name
        d = json.loads(capsys.readouterr().out)
        assert d["ok"] and d["problems"] == [] and d["num_layers"] == rs.config(name)["text_config"][
            "num_hidden_layers"], name
    ck = open_checkpoint(tmp_path / f"26b-a4b-{quant}")
    assert ck.info("layers.3.experts.switch_glu.gate_proj.weight").shape[0] == 128
    if quant:
        assert ck.config["quantization"]["language_model.model.layers.0.router.proj"]["bits"] == 8


def test_layer_cut_real_width_e2b_equals_mlx_lm(tmp_path):
    """Real E2B widths (d=1536, head dims 256/512, PLE 256, a KV-shared double-wide layer),
    6 layers and a 2048-token vocabulary: our trace's logits equal mlx-lm's exactly."""
    from mlx_lm.utils import load_model

    p = rs.build_random("e2b", tmp_path / "e2b", layers=6, vocab_size=2048)
    ref, _ = load_model(p, strict=True)
    model = workbench.load(p)
    ids = mx.array([[5, 17, 300, 9, 1000, 42, 7, 8]], mx.int32)
    t = workbench.trace(model, ids[0], capture="stats")
    t.run()
    want = ref(ids)
    assert t.logits.shape == want.shape == (1, 8, 2048)
    assert float(mx.abs(want).max()) > 1.0  # not a trivial model
    assert float(mx.abs(t.logits.astype(mx.float32) - want.astype(mx.float32)).max()) == 0.0
