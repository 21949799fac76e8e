"""The diff on dumps printed by llama.cpp itself (issue 29), not by our writer.

tests/data/engines/*.real.ggml.txt are llama-eval-callback's output (llama.cpp 4227c9b, from
llama-cpp-python 0.3.16's sdist, CPU, f32 GGUF made by its convert_hf_to_gguf.py) for the tiny
llama of tests/data/archs; scripts/make_llama_cpp_dumps.py rebuilds them.  Neither llama.cpp
nor torch is needed here: the tests read the committed text.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.diff.engines import load
from workbench.diff.ggml_text import read_eval_callback

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "engines"
sys.path.insert(0, str(HERE / "data"))
#: the prompt "abcde" in the script's vocab: BOS, the space prefix, a..e
IDS = "1,3,17,42,7,99,250"
CLEAN = DATA / "llama_clean.real.ggml.txt"
THETA = DATA / "llama_rope_theta.real.ggml.txt"
EPS = DATA / "llama_rms_eps.real.ggml.txt"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from make_arch_refs import HERE as ARCHS, write_checkpoint

    return str(write_checkpoint(tmp_path_factory.mktemp("real") / "llama", ARCHS / "llama"))


def diff(ckpt, dump, capsys, *extra):
    rc = main(["diff", ckpt, str(dump), "--engine", "llama.cpp", "--ids", IDS, "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_the_dumps_are_llama_cpps_own_output():
    clean, theta = CLEAN.read_text(), THETA.read_text()
    eps = EPS.read_text()
    assert "llama.attention.layer_norm_rms_epsilon f32              = 0.500000" in eps
    for t in (clean, theta, eps):
        assert "build: 1 (4227c9b)" in t and "llama_model_loader: loaded meta data" in t
        assert t.count("ggml_debug:") == 76
    assert "llama.rope.freq_base f32              = 5000.000000" in clean
    assert "llama.rope.freq_base" not in theta and "freq_base     = 10000.0" in theta  # the converter dropped it


def test_reader_on_real_names():
    arrays, meta, known = read_eval_callback(CLEAN)
    # GGML's default names (node_N) for the unnamed K.Q, softmax, KQ.V: read per layer and op
    assert {"node-0@SOFT_MAX", "node-1@SOFT_MAX", "node-0@MUL_MAT#0", "node-0@MUL_MAT#1",
            "node-1@GET_ROWS#0", "node-1@GET_ROWS#1"} <= set(arrays)
    assert not any(k.startswith("node_") for k in arrays)
    assert arrays["node-0@SOFT_MAX"].shape == (1, 4, 7, 32)  # 32 cache cells
    # the same view name printed twice (Q's heads, then the roped heads before the permute)
    assert arrays["Qcur-0 (reshaped)@RESHAPE#0"].shape == (1, 7, 4, 16)
    assert "norm-0@RMS_NORM#1" in arrays and "norm" in arrays and "(permuted)@PERMUTE#0" in arrays
    # the last layer keeps the output row only after attn_out
    assert arrays["attn_out-1"].shape == (1, 1, 7, 64) and arrays["l_out-1"].shape == (1, 1, 1, 64)
    k = known["result_output"]
    assert k.sum() == 6 and np.isfinite(arrays["result_output"][k]).all()
    assert meta["workbench.engine"] == "llama.cpp"


def test_real_clean_dump_is_clean(ckpt, capsys):
    rc, out = diff(ckpt, CLEAN, capsys, "--max-nmse", "1e-4")
    assert rc == 0 and out["first_divergence"] is None
    assert out["unmatched_engine"] == [] and out["coverage"]["ops_compared"] == 41
    ops = {o["op"]: o for o in out["ops"]}
    assert max(o["nmse"] for o in out["ops"]) < 1e-5  # f16 KV cache: ~8e-7 at most
    assert "key axis cut" in ops["layers.1.self_attn.softmax"]["layout"]
    assert "per-head rope permutation" in ops["layers.0.self_attn.k_rope"]["layout"]
    assert ops["logits"]["status"] == "ok"
    assert "unnamed node" in out["dropped_why"]["node-0@MUL_MAT#0"]


def test_real_wrong_ids_show_at_the_embedding(ckpt, capsys):
    rc = main(["diff", ckpt, str(CLEAN), "--engine", "llama.cpp", "--ids", "1,3,17,42,7,99,251", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["first_divergence"]["op"] == "embed_tokens"


def test_real_rope_theta_from_the_converter(ckpt, capsys):
    # freq_base 10000 where the checkpoint says 5000 stays under the default nmse 1e-2 on 7 tokens,
    # but its error grows 2e6x at q_rope over q_heads' (printed values: no recompute, the growth rule)
    rc, out = diff(ckpt, THETA, capsys)
    assert rc == 1 and out["first_divergence"] is None
    assert out["first_local_divergence"] == "layers.0.self_attn.q_rope"
    ops = {o["op"]: o for o in out["ops"]}
    assert ops["layers.0.self_attn.q_rope"]["local_rule"] == "growth" and ops["layers.0.self_attn.q_rope"]["ratio"] > 1e5
    rc, out = diff(ckpt, THETA, capsys, "--max-nmse", "1e-4")
    assert rc == 1 and out["first_divergence"]["op"] == "layers.0.self_attn.q_rope"
    assert out["pattern"]["pattern"] == "rope-frequencies"
    ops = {o["op"]: o for o in out["ops"]}
    assert ops["layers.0.self_attn.q_heads"]["status"] == "ok"


def test_real_rms_eps_planted_in_the_gguf(ckpt, capsys):
    rc, out = diff(ckpt, EPS, capsys)
    assert rc == 1 and out["first_divergence"]["op"] == "layers.0.input_layernorm"
    assert out["pattern"]["pattern"] == "norm-eps" and "per-token" in out["pattern"]["text"]
    ops = {o["op"]: o for o in out["ops"]}
    assert ops["embed_tokens"]["status"] == "ok"


def test_unmatched_engine_name_equal_to_an_op():
    """An engine name no rule knows that is also our op's name (llama.cpp's final "norm") loses
    to the tensor a rule maps there, in either order, and nothing crashes."""
    ad = load("llama.cpp")
    ad.rules = [r for r in ad.rules if r["match"] != "norm"]
    a, b = np.zeros((1, 4), np.float32), np.ones((1, 4), np.float32)
    for eng in ({"norm": a, "result_norm": b}, {"result_norm": b, "norm": a}):
        out, info = ad.apply(eng, ["norm"])
        assert np.array_equal(out["norm"], b) and info["engine_names"]["norm"] == "result_norm"
        assert info["unmatched"] == [] and "result_norm" in info["dropped"]["norm"]
