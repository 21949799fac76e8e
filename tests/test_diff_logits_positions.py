"""Logits where they are needed, in dump and diff (issue 28 item 2): a dump records which
positions its head tensors hold (``workbench.logit_positions``), and diff lines up an engine's
rows with the reference's (all against the last, the last against all), compares only those,
says so in its coverage, runs the local errors on the same rows, and refuses in one line
positions that cannot be lined up."""
from __future__ import annotations

import json

import numpy as np
import pytest

import workbench
from workbench.cli import main
from workbench.diff import Reference, compare, dump, read_dump

CKPT = "assets/demo"
IDS = [2, 15, 16, 17, 18, 19, 20, 21, 22]
T = len(IDS)
HEAD = ("lm_head", "logits")


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Our reference dump with every position's logits (the engine's values below start from it)."""
    out = tmp_path_factory.mktemp("full") / "full.safetensors"
    ref = dump(CKPT, out=out, ids=IDS)
    return out, ref


@pytest.fixture(scope="module")
def last(tmp_path_factory):
    out = tmp_path_factory.mktemp("last") / "last.safetensors"
    dump(CKPT, out=out, ids=IDS, logits="last", keep_values=False)  # the CLI's streaming writer
    return out


def _engine(ref: Reference, rows=None, plant_row=None, plant_op="logits") -> dict:
    """The reference's values as an engine dump: the head tensors cut to ``rows`` (None: all
    of them), ``plant_row`` of ``plant_op`` (an index into those rows) shifted."""
    eng = {k: np.array(v) for k, v in ref.values.items()}
    for n in HEAD:
        if rows is not None:
            eng[n] = eng[n][:, rows, :]
    if plant_row is not None:
        eng[plant_op][:, plant_row, :] += 3.0 * np.abs(eng[plant_op]).max()
    return eng


def test_dump_last_carries_its_positions_and_one_row(full, last):
    _, ref = full
    values, meta = read_dump(last)
    vocab = workbench.load(CKPT).vocab_size
    assert json.loads(meta["workbench.logit_positions"]) == [T - 1]
    for n in HEAD:
        assert values[n].shape == (1, 1, vocab)
        assert np.array_equal(values[n][0, 0], ref.values[n][0, T - 1])  # bit for bit the last row of all
    assert values["norm"].shape[-2] == T  # only the head's tensors are cut
    assert Reference.load(last).logit_positions == range(T - 1, T)
    _, meta_all = read_dump(full[0])
    assert json.loads(meta_all["workbench.logit_positions"]) == "all"
    assert Reference.load(full[0]).logit_positions == range(T)


@pytest.mark.parametrize("granularity", ["op", "module"])
def test_dump_positions_at_both_granularities(tmp_path, granularity):
    m = workbench.load(CKPT, granularity=granularity)
    ref = dump(m, out=tmp_path / "d.safetensors", ids=IDS, logits=[0, 4])
    values, meta = read_dump(tmp_path / "d.safetensors")
    assert json.loads(meta["workbench.logit_positions"]) == [0, 4]
    assert values["logits"].shape[-2] == 2 and list(ref.logit_positions) == [0, 4]
    whole = dump(m, ids=IDS, logits="all").values["logits"]
    np.testing.assert_allclose(values["logits"], whole[:, [0, 4]], rtol=1e-5, atol=1e-5)


def test_engine_with_all_rows_against_a_reference_with_the_last(full, last):
    _, ref = full
    clean = compare(last, _engine(ref))
    assert clean.clean and clean.logits["positions"] == [T - 1]
    assert "logits compared at position 8 (the last) of 9 only" in clean.coverage_text()
    assert clean["logits"].shape == (1, 1, ref.values["logits"].shape[-1])
    # a difference at a row the reference does not hold is not seen ...
    early = compare(last, _engine(ref, plant_row=0))
    assert early.clean and early["logits"].status == "ok"
    # ... one at the last row is
    late = compare(last, _engine(ref, plant_row=T - 1))
    assert not late.clean and late.first_divergence.op == "logits"


def test_engine_with_the_last_row_against_a_reference_with_all(full):
    path, ref = full
    one = _engine(ref, rows=[T - 1])
    report = compare(path, one)
    assert report.clean and report.logits["positions"] == [T - 1]
    assert report.logits["engine"] == {"lm_head": "position 8 (the last) of 9", "logits": "position 8 (the last) of 9"}
    assert "compared at position 8 (the last) of 9 only" in report.coverage_text()
    # the engine's one row is our last, not our first: our first row in its place diverges
    wrong = _engine(ref, rows=[0])
    assert compare(path, wrong).first_divergence.op == "lm_head"
    assert compare(path, _engine(ref, rows=[T - 1], plant_row=0)).first_divergence.op == "logits"
    # a [vocab] tensor (no batch, no row axis) is one row too
    flat = dict(one, logits=one["logits"][0, 0], lm_head=one["lm_head"][0, 0])
    assert compare(path, flat).clean


def test_against_the_checkpoint_with_local_errors_on_the_same_rows(full):
    _, ref = full
    report = compare(CKPT, _engine(ref, rows=[T - 1]), ids=IDS)
    assert report.clean and report.logits["positions"] == [T - 1]
    for n in HEAD:  # recomputed on the engine's inputs for the last row only, so computed at all;
        # the engine is our own bfloat16 forward: at most its rounding (the honest recompute's)
        o = report[n]
        assert o.local_nmse is not None and o.precision == "bfloat16" and o.local_rule == "budget"
        assert o.local_power <= max(o.budget_power, 2.0 ** -16) and not o.local_diverged
    bad = compare(CKPT, _engine(ref, rows=[T - 1], plant_row=0, plant_op="lm_head"), ids=IDS)
    assert bad.first_divergence.op == "lm_head" and bad["lm_head"].local_diverged
    # logits="last" against an engine with every row: the last compared, the local head too
    rl = compare(CKPT, _engine(ref, plant_row=0), ids=IDS, logits="last")
    assert rl.clean and rl.logits["positions"] == [T - 1] and rl["lm_head"].local_nmse is not None
    assert not compare(CKPT, _engine(ref, plant_row=T - 1), ids=IDS, logits="last").clean


def test_reference_dump_rows_restricted_by_logits(full, last):
    path, ref = full
    r = compare(path, _engine(ref, plant_row=0), logits="last")
    assert r.clean and r.logits["positions"] == [T - 1]
    assert not compare(path, _engine(ref, plant_row=0)).clean  # without it row 0 is compared
    with pytest.raises(ValueError, match="holds logits at position 8 .the last. of 9, not at positions 0..1"):
        compare(last, _engine(ref), logits=slice(0, 2))


def _save(eng: dict, path) -> str:
    np.savez(path, **eng)
    return str(path)


def test_positions_that_cannot_be_lined_up(full, tmp_path):
    path, ref = full
    two = dump(CKPT, out=tmp_path / "two.safetensors", ids=IDS, logits=[0, 1])
    with pytest.raises(ValueError, match=r"engine's 'lm_head' holds position 8 \(the last\) of 9, the reference "
                                         r"positions 0..1 of 9: neither"):
        compare(tmp_path / "two.safetensors", _engine(ref, rows=[T - 1]))
    assert compare(tmp_path / "two.safetensors", _engine(ref)).logits["positions"] == [0, 1]
    assert two.logit_positions == range(0, 2)
    with pytest.raises(ValueError, match="holds 3 rows of the 9-token input and its dump does not say which"):
        compare(path, _engine(ref, rows=[2, 3, 4]))


def test_cli_dump_and_diff_logits(full, tmp_path, capsys):
    path, ref = full
    out = tmp_path / "cli.safetensors"
    ids = ",".join(map(str, IDS))
    assert main(["dump", CKPT, "--ids", ids, "--out", str(out), "--logits", "last", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["logit_positions"] == [T - 1]
    assert read_dump(out)[0]["logits"].shape[-2] == 1
    assert main(["dump", CKPT, "--ids", ids, "--out", str(tmp_path / "s.safetensors"), "--logits", "2:5"]) == 0
    assert "logits: positions 2..4 of 9" in capsys.readouterr().out
    assert json.loads(read_dump(tmp_path / "s.safetensors")[1]["workbench.logit_positions"]) == [2, 3, 4]
    eng = _save(_engine(ref, plant_row=0), tmp_path / "eng.npz")
    assert main(["diff", str(out), eng, "--json"]) == 0  # the reference holds the last row only
    rep = json.loads(capsys.readouterr().out)
    assert rep["logits"]["positions"] == [T - 1] and rep["logits"]["compared"] == "position 8 (the last) of 9"
    assert main(["diff", str(path), eng, "--json"]) == 1  # every row: the planted one is seen
    capsys.readouterr()
    assert main(["diff", str(path), eng, "--logits", "last"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("no divergence") and "compared at position 8 (the last) of 9 only" in text
    assert main(["diff", CKPT, eng, "--ids", ids, "--logits", "-1"]) == 0
    capsys.readouterr()
    assert main(["diff", CKPT, eng, "--ids", ids, "--logits", "0,8"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("cmd, value, words", [
    ("dump", "first", "--logits 'first': give all, last, START:STOP or comma-separated positions"),
    ("dump", "1.5", "--logits '1.5'"),
    ("dump", "20", "position 20 out of range for a 9-token forward"),
    ("dump", "3,3", "position 3 given twice"),
    ("diff", "1:2:0", "a slice step cannot be zero"),
    ("diff", "x,y", "--logits 'x,y'"),
    ("diff", "9", "position 9 out of range"),
    ("diffref", "0:2", "the reference dump holds logits at position 8 (the last) of 9, not at positions 0..1"),
    ("diffmismatch", None, "neither holds the other's"),
])
def test_bad_logits_are_one_line_exit_2(full, last, tmp_path, capsys, cmd, value, words):
    path, ref = full
    ids = ",".join(map(str, IDS))
    out = tmp_path / "x.safetensors"
    eng = _save(_engine(ref), tmp_path / "eng.npz")
    argv = {"dump": ["dump", CKPT, "--ids", ids, "--out", str(out)],
            "diff": ["diff", CKPT, eng, "--ids", ids],
            "diffref": ["diff", str(last), eng],
            "diffmismatch": ["diff", str(last), _save(_engine(ref, rows=[0]), tmp_path / "one.npz")]}[cmd]
    if cmd == "diffmismatch":  # the engine's one row (the last, by the rule) against a dump of row 0
        assert main(["dump", CKPT, "--ids", ids, "--out", str(out), "--logits", "0"]) == 0
        capsys.readouterr()
        argv = ["diff", str(out), str(tmp_path / "one.npz")]
    assert main(argv + (["--logits", value] if value else [])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    if cmd == "dump":
        assert not out.exists()


def test_dump_default_past_the_logits_budget_keeps_the_last_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORKBENCH_LOGITS_BUDGET", "1kB")  # [9, 522] is well past it
    out = tmp_path / "b.safetensors"
    assert main(["dump", CKPT, "--ids", ",".join(map(str, IDS)), "--out", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert "logits: position 8 (the last) of 9" in text[0] and "logits budget" in text[1] and len(text) == 2
    assert json.loads(read_dump(out)[1]["workbench.logit_positions"]) == [T - 1]
