"""Real engines in the diff (issue 29): transformers and llama.cpp dumps with planted bugs.

The dumps in tests/data/engines were written by scripts/make_engine_dumps.py with transformers
(torch) as the engine, one planted bug at a time; torch is not needed here.  Each bug must be
reported at the op where it enters, with its pattern named, through `--engine` and no --map.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.diff import compare
from workbench.diff.ggml_text import read_eval_callback
from workbench.diff.readers import DumpError, read_dump

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "engines"
sys.path.insert(0, str(HERE / "data"))
IDS = "3,17,42,7,99,250,1"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from make_arch_refs import HERE as ARCHS, write_checkpoint

    root = tmp_path_factory.mktemp("engines")
    return {c: str(write_checkpoint(root / c, ARCHS / c)) for c in ("llama", "qwen3", "gemma3_text", "gemma4_text")}


#: (dump, checkpoint, the op where the bug enters, how it is found, pattern)
BUGS = [
    ("llama_rope_theta", "llama", "layers.0.self_attn.q_rope", "local", "rope-frequencies"),
    ("gemma3_norm_w", "gemma3_text", "layers.0.input_layernorm", "divergence", "norm-scale-w"),
    ("qwen3_attn_scale", "qwen3", "layers.1.self_attn.softmax", "divergence", "attention-scale"),
    ("gemma3_softcap", "gemma3_text", "logits", "divergence", "softcap"),
    ("gemma4_softcap", "gemma4_text", "logits", "local", "softcap"),
    ("llama_bf16_down", "llama", "layers.1.mlp.down_proj", "local", "precision"),
    ("llama_decode_kv_off", "llama", "layers.0.self_attn.q_rope", "divergence", "rope-position"),
]


@pytest.mark.parametrize("dump,case,op,how,pattern", BUGS, ids=[b[0] for b in BUGS])
def test_planted_bug_found_at_its_op(ckpt, capsys, dump, case, op, how, pattern):
    rc = main(["diff", ckpt[case], str(DATA / f"{dump}.safetensors"), "--engine", "transformers", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["engine"] == "transformers"
    assert out["unmatched_engine"] == []  # every tensor the hooks recorded is an op or dropped on purpose
    assert out["coverage"]["enough"]
    if how == "divergence":
        assert out["first_divergence"]["op"] == op
    else:  # within the fixed limits, wrong on the engine's own inputs
        assert out["first_divergence"] is None
        assert out["first_local_divergence"] == op
    assert out["pattern"]["op"] == op and out["pattern"]["pattern"] == pattern
    if dump == "gemma4_softcap":
        assert "engine's cap is ~10, ours ~30" in out["pattern"]["text"]
    assert out["decode"] == dump.startswith("llama_decode")


@pytest.mark.parametrize("dump,case", [("llama_clean", "llama"), ("qwen3_clean", "qwen3"),
                                       ("gemma3_clean", "gemma3_text"), ("gemma4_clean", "gemma4_text"),
                                       ("llama_decode_clean", "llama")])
def test_clean_engine_is_clean_without_map(ckpt, capsys, dump, case):
    rc = main(["diff", ckpt[case], str(DATA / f"{dump}.safetensors"), "--json"])  # the dump names its engine
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out["verdict"]
    assert out["outcome"] == "no-divergence" and out["unmatched_engine"] == []
    assert out["coverage"]["ops_compared"] >= 38
    ops = {o["op"] for o in out["ops"]}  # the ops only hooks and the RoPE wrapper see are compared
    assert {"layers.0.self_attn.q_rope", "layers.0.self_attn.context", "layers.1.mlp.act", "logits"} <= ops
    if dump.startswith("gemma"):
        assert "embed_scale" in ops and "layers.1.pre_feedforward_layernorm" in ops
    if dump.startswith("gemma4"):  # per-layer inputs (PLE) too
        assert {"per_layer_embed_scale", "per_layer_projection_norm", "layers.3.per_layer_input_act"} <= ops


def test_decode_step_compares_the_last_row(ckpt):
    r = compare(ckpt["llama"], str(DATA / "llama_decode_clean.safetensors"))
    assert r.decode and r.clean
    assert r["layers.1"].shape == (1, 1, 64)  # our full forward's row 6
    assert r["layers.0.self_attn.softmax"].shape == (1, 4, 1, 7)
    assert r.logits["positions"] == [6]
    # without the decode reading, the one-token dump does not fit the 7-token forward
    r2 = compare(ckpt["llama"], str(DATA / "llama_decode_clean.safetensors"), decode=False, local=False)
    assert not r2.clean


def test_eval_callback_reader_reads_the_printed_corner():
    arrays, meta, known = read_eval_callback(DATA / "llama_clean.ggml.txt")
    eng, _ = read_dump(DATA / "llama_clean.safetensors")
    assert meta["workbench.engine"] == "llama.cpp"
    a, k = arrays["l_out-1"], known["l_out-1"]
    assert a.shape == (1, 1, 7, 64) and k.sum() == 6 * 6  # 3 first and 3 last of 7 tokens x 64 channels
    want = eng["model.layers.1"][0]
    got = a[0, 0]
    assert np.all(np.isnan(got[~k[0, 0]]))
    np.testing.assert_allclose(got[k[0, 0]], want[k[0, 0]], atol=5.1e-5)  # printed with 4 decimals
    assert "Qcur-0@MUL_MAT" in arrays and "Qcur-0@ROPE" in arrays  # one name, two nodes
    assert arrays["kq_soft_max-0"].shape == (1, 4, 7, 32)  # the cache's 32 cells


def test_eval_callback_bad_value_is_one_line(tmp_path, capsys, ckpt):
    text = (DATA / "llama_clean.ggml.txt").read_text().replace("sum =", "sum =", 1)
    lines = text.splitlines()
    i = next(n for n, l in enumerate(lines) if l.strip().startswith("[") and "," in l)
    lines[i] = lines[i].replace(",", ", oops,", 1)
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines))
    with pytest.raises(DumpError, match="oops"):
        read_eval_callback(bad)
    rc = main(["diff", ckpt["llama"], str(bad), "--engine", "llama.cpp", "--ids", IDS])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "oops" in err


def test_llama_cpp_clean_and_planted(ckpt, capsys):
    def run(name, *extra):
        rc = main(["diff", ckpt["llama"], str(DATA / f"{name}.ggml.txt"), "--engine", "llama.cpp", "--ids", IDS,
                   "--json", *extra])
        return rc, json.loads(capsys.readouterr().out)

    rc, out = run("llama_clean", "--max-nmse", "1e-4")
    assert rc == 0 and out["unmatched_engine"] == [] and out["coverage"]["ops_compared"] == 33
    q = next(o for o in out["ops"] if o["op"] == "layers.0.self_attn.q_proj")
    assert "per-head rope permutation" in q["layout"] and "elements the dump prints" in q["layout"]
    sm = next(o for o in out["ops"] if o["op"] == "layers.0.self_attn.softmax")
    assert "key axis cut" in sm["layout"]
    rc, out = run("llama_decode_kv_off", "--decode")
    assert rc == 1 and out["first_divergence"]["op"] == "layers.0.self_attn.q_rope"
    assert out["pattern"]["pattern"] == "rope-position" and "+1" in out["pattern"]["text"]
    # a wrong rope theta on 7 tokens stays under the default nmse 1e-2; the printed float32 values allow 1e-4
    rc, out = run("llama_rope_theta", "--max-nmse", "1e-4")
    assert rc == 1 and out["first_divergence"]["op"] == "layers.0.self_attn.q_rope"
    assert out["pattern"]["pattern"] == "rope-frequencies"


def test_unmatched_names_come_first_with_closest(ckpt, tmp_path, capsys):
    from safetensors.numpy import save_file

    eng, meta = read_dump(DATA / "llama_clean.safetensors")
    eng["model.layers.0.self_attn.q_prj"] = eng.pop("model.layers.0.self_attn.q_proj")
    save_file(eng, str(tmp_path / "e.safetensors"), metadata=meta)
    rc = main(["diff", ckpt["llama"], str(tmp_path / "e.safetensors"), "--engine", "transformers"])
    first = capsys.readouterr().out.splitlines()[0]
    assert rc == 0  # (one op fewer compared, nothing wrong)
    assert first.startswith("engine tensors matching no op (1): model.layers.0.self_attn.q_prj (closest: ")
    assert "layers.0.self_attn.q_proj" in first


def test_unknown_engine_is_exit_2(ckpt, capsys):
    rc = main(["diff", ckpt["llama"], str(DATA / "llama_clean.safetensors"), "--engine", "vllm"])
    err = capsys.readouterr().err
    assert rc == 2 and "no such engine adapter" in err and len(err.strip().splitlines()) == 1


def test_raw_module_names_without_adapter_do_not_pass(ckpt):
    eng, _ = read_dump(DATA / "llama_clean.safetensors")  # a plain mapping carries no engine name
    ids = [3, 17, 42, 7, 99, 250, 1]
    r = compare(ckpt["llama"], eng, ids=ids, local=False, rules=[])  # an empty map: the names as they are
    assert r.engine is None and not r.clean and r.low_coverage
    r = compare(ckpt["llama"], eng, ids=ids, local=False)  # no map: matched by value, and said (issue 42)
    assert r.engine is None and r.automap.reason.startswith("the engine's names matched 2 of its 47 tensors")
    assert r.automap.mapping["model.layers.1.self_attn.o_proj"] == "layers.1.self_attn.o_proj"
    assert not [m for m in r.automap.matches if m.how == "shape"]  # (the same values twice: listed, not placed)
    assert {"engine": ["model.last_hidden_state", "model.norm"], "ops": ["norm"]}.items() <= \
        next(a for a in r.automap.ambiguous if "model.norm" in a["engine"]).items()
    r = compare(ckpt["llama"], eng, ids=ids, engine_adapter="transformers", local=False)
    assert r.engine == "transformers" and r.clean and r.compared >= 38


def test_llama_cpp_gemma3_names_views_and_output_rows(ckpt, capsys):
    """Gemma 3's graph names: inp_scaled, `Qcur-0 (reshaped)` views, ffn_post_norm printed
    without its layer, and the last layer holding the last token's row only (inp_out_ids)."""
    arrays, _, _ = read_eval_callback(DATA / "gemma3_clean.ggml.txt")
    assert {"Qcur-0 (reshaped)", "Qcur-0@MUL_MAT", "Qcur-0@ROPE", "ffn_post_norm@MUL#0",
            "ffn_post_norm@MUL#1"} <= set(arrays)

    def run(name):
        rc = main(["diff", ckpt["gemma3_text"], str(DATA / f"{name}.ggml.txt"), "--engine", "llama.cpp",
                   "--ids", IDS, "--max-nmse", "1e-4", "--json"])
        return rc, json.loads(capsys.readouterr().out)

    rc, out = run("gemma3_clean")
    assert rc == 0 and out["unmatched_engine"] == [] and out["coverage"]["compared"] == 47
    by = {o["op"]: o for o in out["ops"]}
    assert "last position only" in by["layers.1.mlp.down_proj"]["layout"]
    assert by["layers.1.post_feedforward_layernorm"]["engine_name"] == "ffn_post_norm@MUL#1"
    assert by["layers.0.pre_feedforward_layernorm"]["engine_name"] == "ffn_norm-0"  # Gemma's, not Llama's
    rc, out = run("gemma3_norm_w")
    assert rc == 1 and out["first_divergence"]["op"] == "layers.0.input_layernorm"
    assert out["pattern"]["pattern"] == "norm-scale-w"


def test_against_a_reference_dump(ckpt, tmp_path, capsys):
    """The adapters, --decode and the llama.cpp text work against `workbench dump`'s file too."""
    ref = tmp_path / "ref.safetensors"
    assert main(["dump", ckpt["llama"], "--ids", IDS, "--out", str(ref)]) == 0
    capsys.readouterr()
    rc = main(["diff", str(ref), str(DATA / "llama_decode_kv_off.safetensors"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["decode"] and out["first_divergence"]["op"] == "layers.0.self_attn.q_rope"
    assert out["pattern"]["pattern"] == "rope-position"
    rc = main(["diff", str(ref), str(DATA / "llama_clean.ggml.txt"), "--engine", "llama.cpp", "--max-nmse", "1e-4",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["unmatched_engine"] == [] and out["coverage"]["ops_compared"] == 33
