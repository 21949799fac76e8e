"""A trace split by layers across processes (workbench.distributed): the plan, and real runs
under ``mlx.launch --backend ring`` on localhost whose gathered steps and logits must equal
a one-process trace of the same checkpoint."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.distributed import balanced_split, make_plan, trace_distributed
from workbench.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
IDS = [2, 15, 16, 17, 40, 99, 7, 3, 128, 64, 5, 201]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    return {"llama": zoo.build("llama", d / "llama", dtype="float32"),
            "gemma4_text": zoo.build("gemma4_text", d / "g4", dtype="float32")}


# --------------------------------------------------------------------------- the wire
class _Loopback:
    """send/recv of wire.py over a queue in this process (what a peer sent, in order)."""

    def __init__(self, monkeypatch):
        from workbench.distributed import wire

        self.sent = []
        monkeypatch.setattr(wire, "_send", lambda x, dst, group: self.sent.append(np.array(x)))
        monkeypatch.setattr(wire, "_recv", self._recv)

    def _recv(self, shape, dtype, src, group):
        a = self.sent.pop(0)
        assert a.shape == tuple(shape), (a.shape, shape)  # what the receiver allocates is what came
        return mx.array(a)

    def header(self, doc):
        raw = json.dumps(doc).encode()
        self.sent = [np.frombuffer(len(raw).to_bytes(8, "little"), np.uint8), np.frombuffer(raw, np.uint8)]


def test_bundles_round_trip_and_garbled_headers_are_wire_errors(monkeypatch):
    from workbench.distributed import WireError
    from workbench.distributed.wire import MAX_HEADER, recv_bundle, send_bundle

    net = _Loopback(monkeypatch)
    vals = {"h": mx.arange(12, dtype=mx.float32).reshape(3, 4).astype(mx.bfloat16),
            "m": mx.array([[True, False]]), "e": mx.zeros((0, 5), mx.float16)}
    assert send_bundle(vals, {"k": 1}, 1, None) == 12 * 2 + 2
    meta, got = recv_bundle(0, None)
    assert meta == {"k": 1} and set(got) == set(vals) and not net.sent
    for k, v in vals.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and mx.array_equal(got[k], v).item()
    entry = {"name": "h", "dtype": "float32", "shape": [3, 4], "offset": 0, "nbytes": 48}
    for doc, says in [({"meta": {}, "arrays": [entry], "payload": 2**62}, "payload"),
                      ({"meta": {}, "arrays": [entry], "payload": 40}, "does not match"),
                      ({"meta": {}, "arrays": [dict(entry, nbytes=44)], "payload": 48}, "does not match"),
                      ({"meta": {}, "arrays": [dict(entry, shape=[-3, -4])], "payload": 48}, "does not match"),
                      ({"meta": {}, "arrays": [dict(entry, dtype="float128")], "payload": 48}, "float128"),
                      ({"meta": {}, "arrays": [{"name": "h"}], "payload": 48}, "array entry"),
                      ({"arrays": []}, "not a workbench bundle")]:
        net.header(doc)
        with pytest.raises(WireError, match=says):
            recv_bundle(3, None)
        assert len(net.sent) == 0  # nothing received (or allocated) for the payload
    net.sent = [np.frombuffer((MAX_HEADER + 1).to_bytes(8, "little"), np.uint8)]
    with pytest.raises(WireError, match="header length"):
        recv_bundle(3, None)


# --------------------------------------------------------------------------- the plan

def test_balanced_split_minimises_the_largest_rank():
    assert balanced_split([1, 1, 1, 1], 2) == [2, 2]
    assert balanced_split([1, 1, 1, 10], 2) == [3, 1]
    assert balanced_split([1, 1, 1, 1], 2, head=3) == [1, 3]  # the embeddings weigh on rank 0
    assert balanced_split([5, 1, 1, 1, 1, 5], 3) == [1, 4, 1]
    with pytest.raises(UsageError, match="3 ranks but the model has 2 layers"):
        balanced_split([1, 1], 3)


def test_plan_sends_what_later_ranks_read(ckpts):
    # gemma4_text: 6 layers, PLE, layers 4 and 5 share layers 3's / 2's keys and values
    m = workbench.load(ckpts["gemma4_text"])
    p = make_plan(m.program, 3, [3, 1, 2])
    assert p.layers == [(0, 2), (3, 3), (4, 5)]
    assert p.sends[0] == ["per_layer_inputs", "layers.2.self_attn.k_cache", "layers.2.self_attn.v_cache", "layers.2"]
    # rank 1 forwards what rank 2 still needs from rank 0, and adds its own
    assert p.sends[1] == ["per_layer_inputs", "layers.2.self_attn.k_cache", "layers.2.self_attn.v_cache",
                          "layers.3.self_attn.k_cache", "layers.3.self_attn.v_cache", "layers.3"]
    # every op on exactly one rank, in program order; the head and tail on the first / last rank
    assert sum(p.ranks, []) == list(range(len(m.program)))
    assert p.names(0)[0] == "embed_tokens" and p.names(2)[-1] == "logits"
    # each sub-program is a valid program over the values it receives
    for r in range(3):
        sub = p.subprogram(r)
        assert set(p.received(r)) <= set(sub.inputs)
    # default: balanced by the bytes of the tensors each rank reads
    sizes = {n: m.checkpoint.info(n).nbytes for n in m.tensor_names}
    assert make_plan(m.program, 2, None, sizes).layers == [(0, 2), (3, 5)]
    for bad, msg in (([3, 2], "covers 5 layers; the model has 6"), ([6, 0], "at least one layer"),
                     ([6], "1 layer count for 2 ranks")):
        with pytest.raises(UsageError, match=msg):
            make_plan(m.program, 2, bad)


def test_one_rank_equals_the_plain_trace(ckpts):
    """With one process the distributed trace is the plain trace (same steps, same logits)."""
    path = ckpts["gemma4_text"]
    t = trace_distributed(path, IDS)
    ref = workbench.load(path).trace(IDS)
    ref.run()
    assert t.records() == ref.records()
    assert mx.array_equal(t.logits, ref.logits).item()
    assert t.ranks[0]["layers"] == [0, 5] and t.done
    with pytest.raises(UsageError, match="match no op"):
        trace_distributed(path, IDS, capture=["nothing.*"])
    with pytest.raises(UsageError, match="cannot open"):
        trace_distributed(path.parent / "absent", IDS)


# --------------------------------------------------------------------------- real ranks

def _free_ports(n: int) -> int:
    """A first port with the next n - 1 free too (the ring backend listens on p, p+1 ...)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n >= 65535:
            continue
        try:
            socks = []
            for k in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p + k))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def _launch(n: int, args: list[str], timeout: float = 40, script=None, hostfile=None) -> subprocess.CompletedProcess:
    """``mlx.launch --backend ring -n N -- python -I -m workbench.cli distributed ARGS`` (or
    ``python -I SCRIPT``: isolated, as docs/distributed.md says to run a rank; or ``--hostfile`` for the hosts) on localhost, the whole process group
    killed past ``timeout``."""
    launcher = Path(sys.executable).parent / "mlx.launch"
    assert launcher.exists(), f"mlx's launcher is missing next to {sys.executable}"
    hosts = ["--hostfile", str(hostfile)] if hostfile else ["--backend", "ring", "-n", str(n)]
    cmd = [str(launcher), *hosts, "-p", str(_free_ports(n)), "--",
           sys.executable, "-I", *([str(script)] if script else ["-m", "workbench.cli", "distributed"]), *args]
    proc = subprocess.Popen(cmd, cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mlx.launch did not finish in {timeout} s:\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _close(a, b, what):
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), what
    else:
        assert a == b, what


def _same_steps(got: list[dict], want: list[dict]):
    assert [r["name"] for r in got] == [r["name"] for r in want]
    assert [r["index"] for r in got] == list(range(len(want)))  # program order
    for g, w in zip(got, want):
        for k in ("kind", "layer", "input_shapes", "output_shape", "dtype"):
            assert g[k] == w[k], (g["name"], k)
        assert g["stats"] is not None and set(g["stats"]) == set(w["stats"]), g["name"]
        for k, v in w["stats"].items():
            _close(g["stats"][k], v, (g["name"], k))


@pytest.mark.parametrize("arch,ranks,extra", [
    ("llama", 2, ["--capture", "layers.0.*"]),          # default split (by weight bytes): layers 0-1 | 2
    ("gemma4_text", 3, ["--layers", "3,1,2"]),           # PLE and KV sharing forwarded across two hops
])
def test_ranks_equal_one_process(ckpts, tmp_path, arch, ranks, extra):
    path = ckpts[arch]
    out = tmp_path / "logits.npy"
    # the two-host recipe's hostfile (docs/distributed.md), both hosts this one
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * ranks}))
    r = _launch(ranks, [str(path), "--ids", ",".join(map(str, IDS)), "--json", "--logits", str(out), *extra],
                hostfile=hostfile if arch == "llama" else None)
    assert "Traceback" not in r.stderr and "WARN" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)  # only rank 0 prints
    model = workbench.load(path)
    ref = model.trace(IDS)
    ref.run()
    _same_steps(doc["steps"], ref.records())
    # the logits equal the one-process run's
    logits = np.load(out, allow_pickle=False)
    assert logits.shape == (1, len(IDS), model.vocab_size)
    np.testing.assert_allclose(logits, np.array(ref.logits.astype(mx.float32)), rtol=1e-5, atol=1e-6)
    assert doc["logits"]["last_argmax"] == int(np.argmax(logits[0, -1]))
    # each rank ran its own layers and read only the tensors of its own ops
    parts = doc["ranks"]
    assert [p["rank"] for p in parts] == list(range(ranks))
    assert parts[0]["layers"][0] == 0 and parts[-1]["layers"][1] == model.num_layers - 1
    names = set(model.tensor_names)
    plan = make_plan(model.program, ranks, [p["layers"][1] - p["layers"][0] + 1 for p in parts])
    for p in parts:
        own = {t for i in plan.ranks[p["rank"]] for t in model.program.ops[i].tensor_names(names)}
        # the final norm's dtype is probed at load (lazily: no bytes read) on every rank
        assert set(p["tensors"]) - {"norm.weight"} <= own, p["rank"]
        assert own <= set(p["tensors"]) | {"norm.weight"}, p["rank"]
        lo, hi = p["layers"]
        assert all(lo <= int(t.split(".")[1]) <= hi for t in p["tensors"] if t.startswith("layers.")), p["rank"]


def test_bad_input_is_one_line_per_rank(ckpts):
    # rank 0 refuses the ids after the plan: the rank waiting on it says so in one line, no hang
    r = _launch(2, [str(ckpts["gemma4_text"]), "--ids", "2,999"])
    lines = [ln for ln in r.stderr.splitlines() if "workbench distributed:" in ln]
    assert "workbench distributed: rank 0: token id 999 out of range for a vocabulary of 256" in lines, r.stderr
    assert all(ln.startswith("workbench distributed: rank ") for ln in lines), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    # without a launcher (one process): exit 2, one line
    for args, msg in ((["--ids", "2,999"], "out of range"),
                      (["--ids", "2,15", "--layers", "7"], "--layers 7 covers 7 layers; the model has 6"),
                      (["--ids", "2,15", "--attention", "x"], "--attention: 'x' is not an integer")):
        p = subprocess.run([sys.executable, "-m", "workbench.cli", "distributed", str(ckpts["gemma4_text"]), *args],
                           cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and msg in p.stderr, p.stderr

def test_a_padded_batch_with_full_capture(ckpts, tmp_path):
    """The library call on every rank: a left-padded batch (its mask crosses as bool),
    capture="full" (values stay on their rank; the steps and logits come to rank 0), and
    explicit attention on layers 2 and 5 (layer 5 attends to layer 2's keys across ranks),
    and an intervention on rank 1's ops (applied there, recorded in its steps)."""
    path = ckpts["gemma4_text"]
    batch = [[2, 15, 16, 17, 40, 99], [2, 99, 7]]
    out = tmp_path / "logits.npy"
    script = tmp_path / "run.py"
    script.write_text(
        "import io, json, sys\nimport numpy as np\nimport workbench\n"
        "from workbench.distributed import trace_distributed\n"
        "from workbench.trace import zero_head\n"
        f"t = trace_distributed({str(path)!r}, {batch!r}, capture='full', attention=[2, 5],\n"
        "                      interventions=[zero_head('layers.4.self_attn.context', head=1)])\n"
        "if t is not None:\n"
        f"    np.save({str(out)!r}, np.array(t.logits), allow_pickle=False)\n"
        "    print(json.dumps(t.records()))\n")
    r = _launch(2, [], script=script)
    assert "Traceback" not in r.stderr and "WARN" not in r.stderr, r.stderr
    from workbench.trace import Run, zero_head

    ref = workbench.load(path).trace(batch, capture="full", run=Run(attention=[2, 5]),
                                     interventions=[zero_head("layers.4.self_attn.context", head=1)])
    ref.run()
    steps = json.loads(r.stdout)
    assert "layers.5.self_attn.softmax" in [s["name"] for s in steps]
    assert [s["name"] for s in steps if s["intervened"]] == ["layers.4.self_attn.context"]
    _same_steps(steps, ref.records())
    np.testing.assert_allclose(np.load(out), np.array(ref.logits), rtol=1e-5, atol=1e-6)


def test_ranks_that_disagree_stop_with_one_line(ckpts, tmp_path):
    """Rank 1 asked for another compute dtype than rank 0: it names the difference, no hang."""
    script = tmp_path / "run.py"
    script.write_text(
        "import os, sys\nimport workbench\nfrom workbench.errors import UsageError\n"
        "from workbench.distributed import WireError, trace_distributed\n"
        "dtype = 'float32' if os.environ['MLX_RANK'] == '0' else 'bfloat16'\n"
        "try:\n"
        f"    trace_distributed({str(ckpts['llama'])!r}, [2, 15, 16], dtype=dtype)\n"
        "except (UsageError, WireError) as e:  # rank 0 then loses rank 1\n"
        "    print(f'error: {e}', file=sys.stderr)\n"
        "    sys.exit(2)\n")
    r = _launch(2, [], script=script)
    assert ("error: rank 1 and rank 0 do not run the same trace (dtype 'float32' there, 'bfloat16' here)"
            in r.stderr), r.stderr
    assert "Traceback" not in r.stderr
