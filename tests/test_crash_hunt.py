"""The crash hunt (workbench hunt --crash, workbench.crash_hunt): the forward in a child
process, one synchronized step at a time; a child killed at a planted step
(WORKBENCH_CRASH_AT, named in every report it affects) is reported by the step, its inputs, its
output and the signal, at both granularities, in Python and on the command line."""
import json
import time
from pathlib import Path

import pytest

import workbench
from workbench.cli import main
from workbench.trace.crash import CRASH_AT_ENV, CrashFinding, suggest

DEMO = str(Path(__file__).resolve().parents[1] / "assets" / "demo")
PROMPT = "anna has a red ball ."
IDS = [2, 15, 16, 17, 18]


@pytest.fixture
def plant(monkeypatch):
    def set_(spec):
        monkeypatch.setenv(CRASH_AT_ENV, spec)
    monkeypatch.delenv(CRASH_AT_ENV, raising=False)
    return set_


def _tokens():
    return len(workbench.load(DEMO).encode(PROMPT))


def test_sigfpe_at_lm_head_names_the_op_its_input_and_signal(plant):
    plant("lm_head:FPE")
    r = workbench.crash_hunt(DEMO, PROMPT)
    T = _tokens()
    f = r.finding
    assert r.found and f.op == "lm_head" and f.kind == "linear" and f.stage == "run"
    assert f.signal == "SIGFPE" and f.exit_code is None and not f.hung
    assert f.inputs == [{"name": "norm", "shape": [1, T, 128], "dtype": "bfloat16", "size": T * 128}]
    assert f.output == {"shape": [1, T, 522], "dtype": "bfloat16", "size": T * 522, "nbytes": T * 522 * 2}
    # every step before it completed, and it is the step the program numbers as lm_head
    model = workbench.load(DEMO)
    assert f.index == model.program.index("lm_head") == r.report["steps_completed"]
    assert r.report["steps"] == len(model.program.ops) and r.report["granularity"] == "op"
    assert r.report["crash"]["signal"] == "SIGFPE" and r.report["crash"]["op"] == "lm_head"
    # the planted variable is named first; then nothing (9 tokens: nothing near 2^31 elements
    # or the memory)
    assert len(f.causes) == 1 and f.causes[0].startswith(f"planted by {CRASH_AT_ENV}=lm_head:FPE")
    assert f.planted == r.report["planted"] == "lm_head:FPE"


def test_module_granularity_sigsegv_at_a_module_call(plant):
    plant("layers.1.mlp:SEGV")
    m = workbench.load(DEMO, granularity="module")
    r = workbench.crash_hunt(m, IDS)  # (a model: the child reopens its path at its granularity)
    f = r.finding
    assert r.report["granularity"] == "module"
    assert (f.op, f.layer, f.signal, f.stage) == ("layers.1.mlp", 1, "SIGSEGV", "run")
    assert [d["shape"] for d in f.inputs] == [[1, len(IDS), 128]]
    assert f.inputs[0]["name"] == "layers.1.pre_feedforward_layernorm" and f.inputs[0]["size"] == len(IDS) * 128
    assert f.output["shape"] == [1, len(IDS), 128]
    assert f.index == r.report["steps_completed"] and f.index == m.trace(IDS, capture=None).ops.index("layers.1.mlp")


@pytest.mark.parametrize("how, expect", [("abort", {"signal": "SIGABRT"}),
                                         ("exit=3", {"signal": None, "exit_code": 3}),
                                         ("raise", {"signal": None, "exit_code": 4})])
def test_abort_exit_and_raise(plant, how, expect):
    plant(f"layers.2.self_attn.o_proj:{how}")
    f = workbench.crash_hunt(DEMO, IDS).finding
    assert f.op == "layers.2.self_attn.o_proj" and f.layer == 2
    for k, v in expect.items():
        assert getattr(f, k) == v, (k, f)
    if how == "raise":
        assert f.error == f"RuntimeError: planted by {CRASH_AT_ENV}"
    else:
        assert f.error is None


def test_glob_plants_at_the_first_match(plant):
    plant("layers.3.*:KILL")
    f = workbench.crash_hunt(DEMO, IDS).finding
    assert f.op.startswith("layers.3.") and f.signal == "SIGKILL"
    assert any("out-of-memory killer" in c for c in f.causes)
    names = workbench.load(DEMO).program.names
    assert f.op == next(n for n in names if n.startswith("layers.3."))


def test_hang_is_a_finding_naming_the_step(plant):
    plant("layers.1.mlp.down_proj:hang")
    t = time.monotonic()
    r = workbench.crash_hunt(DEMO, IDS, timeout=3)
    took = time.monotonic() - t
    f = r.finding
    assert f.hung and f.timeout == 3 and f.signal is None and f.op == "layers.1.mlp.down_proj"
    assert took < 60, took  # killed, not waited for
    assert "hung" in f.how


def test_death_in_the_middle_of_a_message_does_not_hang_the_parent(plant):
    plant("norm:torn")  # half a line on the pipe, then SIGKILL
    t = time.monotonic()
    f = workbench.crash_hunt(DEMO, IDS, timeout=60).finding
    assert time.monotonic() - t < 30
    assert f.op == "norm" and f.signal == "SIGKILL" and not f.hung
    assert any("middle of a message" in c for c in f.causes)


@pytest.mark.parametrize("granularity", ["op", "module"])
def test_clean_run_cli_json_exit_0(plant, capsys, granularity):
    assert main(["hunt", DEMO, "--ids", ",".join(map(str, IDS)), "--crash", "--granularity", granularity,
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["crash"] is None and rep["granularity"] == granularity
    assert rep["steps_completed"] == rep["steps"] > 50 and rep["tokens"] == len(IDS)


@pytest.mark.parametrize("granularity, op", [("op", "layers.0.self_attn.q_proj"), ("module", "layers.0.self_attn.q_proj")])
def test_cli_json_crash_exit_1(plant, capsys, granularity, op):
    plant(f"{op}:FPE")
    rc = main(["hunt", DEMO, "--prompt", PROMPT, "--crash", "--granularity", granularity, "--json"])
    out = capsys.readouterr()
    assert rc == 1 and out.err == ""
    rep = json.loads(out.out)
    c = rep["crash"]
    assert (c["op"], c["signal"], c["layer"], c["stage"]) == (op, "SIGFPE", 0, "run")
    assert c["inputs"] and all(d["shape"][-1] == 128 and d["size"] == _tokens() * 128 for d in c["inputs"])
    assert c["output"]["shape"][:2] == [1, _tokens()]
    assert rep["steps_completed"] == c["index"] < rep["steps"]


def test_cli_text(plant, capsys):
    plant("lm_head")  # (no HOW: SIGFPE)
    assert main(["hunt", DEMO, "--ids", "2,15,16", "--crash"]) == 1
    out = capsys.readouterr().out
    assert "crash: SIGFPE in lm_head (linear, step" in out
    assert "input  norm: bfloat16 [1, 3, 128] (384 elements)" in out
    assert "output bfloat16 [1, 3, 522] (1566 elements" in out


def test_clean_cli_text(plant, capsys):
    assert main(["hunt", DEMO, "--ids", "2,15,16", "--crash"]) == 0
    assert capsys.readouterr().out.startswith("no crash: the forward completed")


def test_unusable_input_exit_2(plant, capsys, tmp_path):
    assert main(["hunt", str(tmp_path / "missing"), "--ids", "2,3", "--crash"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err
    assert main(["hunt", DEMO, "--ids", "2,9999", "--crash", "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out) == {"error": "token id 9999 out of range for a vocabulary of 522"}
    assert main(["hunt", str(tmp_path), "--ids", "2,3", "--crash", "--json"]) == 2  # a directory without a checkpoint
    assert "error" in json.loads(capsys.readouterr().out)
    assert main(["hunt", DEMO, "--ids", "2,3", "--timeout", "5"]) == 2  # --timeout without --crash
    assert "--crash" in capsys.readouterr().err
    with pytest.raises(ValueError, match="timeout"):
        workbench.crash_hunt(DEMO, IDS, timeout=0)


def test_suggested_causes():
    def finding(out_shape, out_size, inputs=(), free=None, nbytes=None):
        return CrashFinding(op="lm_head", index=1, kind="linear", layer=None, stage="run", inputs=list(inputs),
                            output={"shape": out_shape, "dtype": "bfloat16", "size": out_size,
                                    "nbytes": nbytes if nbytes is not None else 2 * out_size},
                            memory_free=free, signal="SIGFPE")

    # E2B at 16,384 tokens: lm_head's [16384, 262144] logits are 2^32 elements
    c = suggest(finding([1, 16384, 262144], 2**32, free=10**15))
    assert len(c) == 1 and "2^32" in c[0] and "[1, 16384, 262144]" in c[0]
    c = suggest(finding([1, 8192, 262144], 2**31, free=10**15))
    assert len(c) == 1 and "2^31" in c[0] and "2^32" not in c[0].split(":")[0]
    big_in = {"name": "x", "shape": [2**31], "dtype": "bfloat16", "size": 2**31}
    c = suggest(finding([4], 4, inputs=[big_in], free=10**15))
    assert len(c) == 1 and c[0].startswith("input x [2147483648]")
    c = suggest(finding([1, 100], 100, free=50, nbytes=200))
    assert len(c) == 1 and "beyond free memory" in c[0]
    assert suggest(finding([1, 100], 100, free=10**9)) == []


def test_logits_positions_reach_the_child(monkeypatch):
    """``logits=`` goes to the child's trace: the head over the positions asked for, as the
    reported output's shape shows."""
    from workbench.trace.crash import crash_hunt

    monkeypatch.setenv(CRASH_AT_ENV, "lm_head:FPE")
    one = crash_hunt("assets/demo", [2, 15, 16, 17], logits="last", timeout=120)
    every = crash_hunt("assets/demo", [2, 15, 16, 17], logits=slice(0, None), timeout=120)
    assert one.found and every.found and one.finding.op == every.finding.op == "lm_head"
    assert one.finding.output["shape"][-2] == 1 and every.finding.output["shape"][-2] == 4
