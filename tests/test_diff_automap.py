"""Names matched by value (issue 42, item 1): an engine's own names mapped onto our ops, no rules written.

The engine dumps are our own forward of the demo model (planted bugs through the trace's
interventions, so everything downstream of a bug moves as it would in a real engine) renamed
with a home-made scheme (``blk0.att_q_proj``, ``tok_emb``, ``final_norm``, ``out_proj``) and
stored in engine layouts (no batch axis, heads merged, transposed, the last position only).
"""
from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

import workbench
from workbench.cli import main
from workbench.diff import compare, run_reference
from workbench.diff.automap import propose
from workbench.diff.naming import load_rules

DEMO = str(Path(__file__).resolve().parents[1] / "assets" / "demo")
IDS = [2, 17, 42, 7, 99, 250, 1]  # 7 tokens: no size coincides with a head count or head dim
T = len(IDS)
ARGS = ["--ids", ",".join(map(str, IDS))]

#: our op (under layers.{i}) -> the engine's own name (under blk{i}.)
SCHEME = {"input_layernorm": "pre_att_norm", "self_attn.q_proj": "att_q_proj", "self_attn.k_proj": "att_k_proj",
          "self_attn.v_proj": "att_v_proj", "self_attn.q_norm": "att_q_normed", "self_attn.q_rope": "att_q_rot",
          "self_attn.k_rope": "att_k_rot", "self_attn.softmax": "att_probs", "self_attn.context": "att_ctx",
          "self_attn.o_proj": "att_out", "post_attention_layernorm": "post_att_norm", "attn_residual": "att_resid",
          "pre_feedforward_layernorm": "pre_ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.act": "ffn_act", "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffn_norm", "": "out"}
TOP = {"embed_tokens": "tok_emb", "per_layer_inputs": "ple_in", "norm": "final_norm", "logits": "out_proj"}


def engine_dump(values, scheme=SCHEME, base=0):
    """(the engine's tensors by its own names, engine name -> our op) in engine layouts."""
    eng, truth = {}, {}
    for op, x in values.items():
        m = re.fullmatch(r"layers\.(\d+)(?:\.(.*))?", op)
        if op in TOP:
            name = TOP[op]
        elif m and (m.group(2) or "") in scheme:
            name = f"blk{int(m.group(1)) + base}." + scheme[m.group(2) or ""]
        else:
            continue
        x = np.asarray(x)[0]  # no batch axis
        if op.endswith("q_rope"):  # heads merged, tokens first: [T, H*D]
            x = x.transpose(1, 0, 2).reshape(T, -1)
        elif op.endswith("down_proj"):  # transposed: [D, T]
            x = x.T
        elif op.endswith("softmax"):  # this one keeps the batch axis: [1, H, T, T]
            x = x[None]
        elif op == "logits":  # the last position only, as an engine computes it to sample
            x = x[-1]
        eng[name], truth[name] = np.ascontiguousarray(x), op
    return eng, truth


def tally(p, truth) -> dict:
    """right (the op), same (an op holding the same values, which the proposal names), ambiguous
    (listed, unmapped), wrong (another op)."""
    out = {"right": 0, "same": 0, "ambiguous": 0, "wrong": []}
    for m in p.matches:
        if m.op == truth[m.engine]:
            out["right"] += 1
        elif m.op is None and m.how == "ambiguous":
            out["ambiguous"] += 1
        elif m.op is not None and truth[m.engine] in m.same:
            out["same"] += 1
        else:
            out["wrong"].append((m.engine, m.op, truth[m.engine]))
    return out


@pytest.fixture(scope="module")
def model():
    return workbench.load(DEMO, attention="explicit")


@pytest.fixture(scope="module")
def ref():
    return run_reference(DEMO, ids=IDS)


def forward(model, interventions=()):
    import mlx.core as mx

    tr = workbench.trace(model, IDS, capture="full", interventions=list(interventions))
    tr.run()
    return {n: np.array(tr.value(n).astype(mx.float32)) for n in model.program.names}


@pytest.fixture(scope="module")
def clean(model):
    return forward(model)


def save(path, eng, meta=None):
    from safetensors.numpy import save_file

    save_file(eng, str(path), metadata=meta)
    return str(path)


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_clean_dump_maps_every_tensor_right(ref, clean):
    eng, truth = engine_dump(clean)
    p = propose(eng, ref.values, ref.order, tokens=T, dtypes=ref.dtypes)
    t = tally(p, truth)
    assert t == {"right": len(eng), "same": 0, "ambiguous": 0, "wrong": []}, t
    assert all(m.how == "value" for m in p.matches) and p.ambiguous == [] and p.offset == 0
    # one rule per kind of name, generalised over the layers (the digits that vary are the layer)
    assert len(p.rules) == len(SCHEME) + len(TOP)
    assert [r"^blk(\d+)\.att_q_proj$", r"layers.\1.self_attn.q_proj"] in p.rules
    assert [r"^blk(\d+)\.out$", r"layers.\1"] in p.rules and [r"^final_norm$", "norm"] in p.rules
    by = {m.engine: m for m in p.matches}
    assert by["out_proj"].op == "logits" and by["out_proj"].last  # the last position only
    assert by["blk0.att_k_rot"].same == ["layers.0.self_attn.k_cache"]  # the same values, said, not guessed
    # q_proj [T, H*D] holds its heads' values too: the layout needing fewer steps decides
    assert by["blk0.att_q_proj"].same == ["layers.0.self_attn.q_heads"] and by["blk0.att_q_rot"].rel == 0.0


def test_cli_without_a_map_matches_by_value_and_says_so(tmp_path, capsys, clean):
    eng, _ = engine_dump(clean)
    f = save(tmp_path / "engine.safetensors", eng)
    rc, out, _ = run(["diff", DEMO, f, *ARGS, "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["outcome"] == "no-divergence", d["verdict"]
    assert d["coverage"]["compared"] == d["coverage"]["engine_tensors"] == len(eng)
    assert d["automap"]["reason"].startswith(f"the engine's names matched 0 of its {len(eng)} tensors")
    assert d["automap"]["counts"]["value"] == len(eng) and d["automap"]["unmapped"] == []
    assert d["renamed"]["blk3.att_out"] == "layers.3.self_attn.o_proj"
    rc, text, _ = run(["diff", DEMO, f, *ARGS], capsys)
    assert rc == 0 and text.startswith("names matched by value (the engine's names matched 0 of its")
    assert "^blk(\\d+)\\.att_q_proj$ -> layers.\\1.self_attn.q_proj" in text and "no divergence" in text
    assert run(["dump", DEMO, *ARGS, "--out", tmp_path / "ref.safetensors"], capsys)[0] == 0
    rc, out, _ = run(["diff", tmp_path / "ref.safetensors", f, "--json"], capsys)  # against a reference dump
    assert rc == 0 and json.loads(out)["automap"]["rules"] == d["automap"]["rules"]
    rc, text, _ = run(["diff", DEMO, f, *ARGS, "--map", "auto"], capsys)  # asked: said as asked
    assert rc == 0 and text.startswith("names matched by value (--map auto): 80 of 80 engine tensors mapped")
    # what the diff said before this matcher (an explicit empty map keeps the names as they are)
    (tmp_path / "none.json").write_text("[]")
    rc, _, err = run(["diff", DEMO, f, *ARGS, "--map", tmp_path / "none.json"], capsys)
    assert rc == 2 and f"none of its {len(eng)} tensors maps to an op" in err and "write a --map rules file" in err


def _per_position(v, op):
    import mlx.core as mx  # a wrong norm eps: each position's scale off by its own factor

    return v * (1 + 0.3 * mx.arange(v.shape[1]).reshape(1, -1, 1) / T).astype(v.dtype)


def _noise(v, op):
    import mlx.core as mx

    return v + (3 * mx.random.normal(v.shape, key=mx.random.key(0))).astype(v.dtype)


BUGS = [("layers.2.mlp.act", lambda v, op: v * 4), ("layers.1.input_layernorm", _per_position),
        ("layers.2.self_attn.o_proj", _noise)]


@pytest.mark.parametrize("target,fn", BUGS, ids=[b[0] for b in BUGS])
def test_behind_a_planted_bug_the_map_holds_and_the_diff_names_the_op(tmp_path, capsys, model, ref, target, fn):
    from workbench.trace.interventions import patch

    eng, truth = engine_dump(forward(model, [patch(target, fn)]))
    p = propose(eng, ref.values, ref.order, tokens=T, dtypes=ref.dtypes)
    t = tally(p, truth)
    assert t["wrong"] == [] and t["ambiguous"] == 0 and t["right"] + t["same"] == len(eng), t
    k = int(target.split(".")[1])
    by_rule = [m for m in p.matches if m.how == "rule"]  # values off: the rule of the layers before holds
    assert by_rule and all(m.op == truth[m.engine] for m in by_rule)
    assert all(int(m.engine[3]) >= k for m in by_rule)
    rc, out, _ = run(["diff", DEMO, save(tmp_path / "e.safetensors", eng), *ARGS, "--map", "auto", "--json"], capsys)
    d = json.loads(out)
    assert rc == 1 and target in ((d["first_divergence"] or {}).get("op"), d["first_local_divergence"]), d["verdict"]
    assert target in d["verdict"] and d["automap"]["reason"] is None


def test_the_same_values_twice_is_listed_and_the_engines_order_settles_it(tmp_path, capsys, clean, ref):
    eng, truth = engine_dump(clean)
    for i in range(4):  # the engine dumps its K cache too: the same values as its rotated K
        eng[f"blk{i}.kv_k"] = eng[f"blk{i}.att_k_rot"].copy()
        truth[f"blk{i}.kv_k"] = f"layers.{i}.self_attn.k_cache"
    p = propose(eng, ref.values, ref.order, tokens=T, dtypes=ref.dtypes)
    assert tally(p, truth)["wrong"] == []
    assert p.ambiguous == [{"engine": ["blk{i}.att_k_rot", "blk{i}.kv_k"],
                            "ops": ["layers.{i}.self_attn.k_cache", "layers.{i}.self_attn.k_rope"],
                            "why": p.ambiguous[0]["why"]}]
    assert "same within rounding: given by the names' likeness" in p.ambiguous[0]["why"]
    # the dump records the engine's execution order: nothing left to guess
    order = sorted(eng, key=lambda n: ("kv_k" in n, n))
    p = propose(eng, ref.values, ref.order, tokens=T, dtypes=ref.dtypes, engine_order=order)
    assert p.ambiguous == [] and tally(p, truth)["right"] == len(eng)
    f = save(tmp_path / "e.safetensors", eng, {"workbench.op_order": json.dumps(order)})
    rc, out, _ = run(["diff", DEMO, f, *ARGS, "--json", "--no-local"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["automap"]["ambiguous"] == [] and d["renamed"]["blk2.kv_k"] == "layers.2.self_attn.k_cache"


def test_a_bug_in_the_first_op_leaves_ties_listed_not_guessed(model, ref):
    from workbench.trace.interventions import patch

    eng, truth = engine_dump(forward(model, [patch("embed_tokens", lambda v, op: v * 3 + 0.1)]))
    p = propose(eng, ref.values, ref.order, tokens=T, dtypes=ref.dtypes)
    t = tally(p, truth)
    assert t["wrong"] == [] and t["ambiguous"] > 0, t
    tok = next(a for a in p.ambiguous if "tok_emb" in a["engine"])  # embed_tokens and embed_scale: one direction
    assert {"embed_tokens", "embed_scale"} <= set(tok["ops"]) and "left unmapped" in tok["why"]
    assert next(m for m in p.matches if m.engine == "tok_emb").op is None


def test_write_map_round_trip(tmp_path, capsys, model):
    from workbench.trace.interventions import patch

    eng, _ = engine_dump(forward(model, [patch("layers.2.mlp.act", lambda v, op: v * 4)]))
    f = save(tmp_path / "e.safetensors", eng)
    rules = tmp_path / "rules.json"
    rc, out, _ = run(["diff", DEMO, f, *ARGS, "--write-map", rules, "--json"], capsys)
    first = json.loads(out)
    assert rc == 1 and first["first_divergence"]["op"] == "layers.2.mlp.act"
    kept = json.loads(rules.read_text())
    assert kept["rules"] == first["automap"]["rules"] and kept["ambiguous"] == [] and kept["unmapped"] == []
    assert len(load_rules(rules)) == len(kept["rules"])
    rc, out, _ = run(["diff", DEMO, f, *ARGS, "--map", rules, "--json"], capsys)
    again = json.loads(out)
    assert rc == 1 and again["automap"] is None
    for key in ("first_divergence", "first_local_divergence", "coverage", "renamed", "verdict"):
        assert again[key] == first[key], key
    assert [(o["op"], o["status"]) for o in again["ops"]] == [(o["op"], o["status"]) for o in first["ops"]]
    # never over a file that is there, nor with a map of the user's own: one line, exit 2
    before = rules.read_bytes()
    for argv, words in ((["--write-map", rules], "exists"), (["--map", rules, "--write-map", tmp_path / "x.json"],
                                                             "--write-map writes the map proposed by value"),
                        (["--map", "auto", "--engine", "transformers"], "not with an engine adapter")):
        rc, out, err = run(["diff", DEMO, f, *ARGS, *argv], capsys)
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert rules.read_bytes() == before and not (tmp_path / "x.json").exists()


def test_one_based_layer_numbers_map_with_an_offset(clean, ref):
    eng, truth = engine_dump(clean, base=1)  # blk1 .. blk4
    p = propose(eng, ref.values, ref.order, tokens=T, dtypes=ref.dtypes)
    assert p.offset == -1 and tally(p, truth)["right"] == len(eng)
    assert ["^blk1\\.att_q_proj$", "layers.0.self_attn.q_proj"] in p.rules  # no arithmetic in a rule: one a name
    assert "our layer = the engine's -1" in p.text()[0]


def test_many_tensors_finish_in_bounded_time(clean, ref):
    """A hostile dump: thousands of tensors, most of a shape our ops have, none of them ours."""
    eng, truth = engine_dump(clean)
    rng = np.random.default_rng(0)
    junk = {f"scratch.{i}": rng.standard_normal((T, 128)).astype(np.float32) for i in range(1500)}
    letters = [chr(97 + k) for k in range(26)]  # names of no digits: each its own, against every op of its size
    junk.update({f"buf_{a}{b}{c}": np.abs(rng.standard_normal((T, 128))).astype(np.float32)
                 for a, b, c in itertools.islice(itertools.product(letters, repeat=3), 1500)})
    junk.update({f"tiny{i}": rng.standard_normal(3).astype(np.float32) for i in range(2000)})
    t0 = time.perf_counter()
    p = propose({**eng, **junk}, ref.values, ref.order, tokens=T, dtypes=ref.dtypes)
    took = time.perf_counter() - t0
    assert took < 30, took
    by = {m.engine: m for m in p.matches}
    assert all(by[n].op is None for n in junk if not n.startswith("buf_"))  # no layer of ours, no likeness
    placed = [m for m in p.matches if m.engine.startswith("buf_") and m.op is not None]  # (all positive: a few
    assert len(placed) <= 5 and all(m.how == "shape" for m in placed)  # look like some op, and say how)
    assert all(by[n].op == truth[n] for n in eng)
    assert len(p.text()) < 40 and "--json lists them" in p.text()[-1]  # thousands of ties, a short report


def test_python_api_takes_auto(clean):
    eng, truth = engine_dump(clean)
    r = compare(DEMO, eng, ids=IDS, rules="auto", local=False)
    assert r.clean and r.automap is not None and r.automap.reason is None
    assert r.automap.mapping == truth and r.to_dict()["automap"]["counts"]["value"] == len(eng)


def test_weights_named_the_engines_way_are_mapped_by_name_and_compared(model, clean):
    from workbench.arrays import weight_values

    eng, truth = engine_dump(clean)
    mods = ["layers.0.mlp.down_proj", "layers.1.self_attn.q_proj", "norm", "layers.3.input_layernorm"]
    weights = {f"w.{m}": weight_values(model, m) for m in mods}
    weights["w.layers.1.self_attn.q_proj"] = weights["w.layers.1.self_attn.q_proj"] * 1.5  # loaded wrong
    r = compare(DEMO, {**eng, **weights}, ids=IDS, rules="auto", local=False)
    assert r.automap.counts["weight"] == 4 and ["^w\\.(.+)$", "\\1.weight"] in r.automap.rules
    assert {w.name: w.status for w in r.weights} == {
        "layers.0.mlp.down_proj.weight": "ok", "layers.1.self_attn.q_proj.weight": "diverged",
        "layers.3.input_layernorm.weight": "ok", "norm.weight": "ok"}
    assert r.first_weight_mismatch.name == "layers.1.self_attn.q_proj.weight" and r.automap.ambiguous == []
    assert all(r.automap.mapping[n] == truth[n] for n in eng)
