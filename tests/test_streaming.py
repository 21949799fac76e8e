"""Models larger than memory (workbench.models.streaming): a streamed model gives the same
logits bit for bit as one holding its weights, reads one segment's weights at a time
(quantized ones packed), spills full captures beyond its budget, and stays under
largest layer + activations + 20% of peak RSS on a checkpoint over twice its budget."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mlx.core as mx
import workbench
from workbench import zoo
from workbench.cli import main as cli_main
from workbench.models.streaming import StreamedModel, segments
from workbench.sizes import parse_bytes
from workbench.trace import Storage

IDS = [2, 15, 16, 17, 18, 19]


def _np(a):
    return np.array(a.astype(mx.float32))


# ----------------------------------------------------------------------------- the budget

def test_parse_bytes():
    assert parse_bytes(4096) == 4096
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("8 GiB") == 8 * 2**30
    assert parse_bytes("1.5gib") == 3 * 2**29
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(" 100 ") == 100
    for bad, words in [("8 parsecs", "not a size"), ("GB", "not a size"), ("-1GB", "positive"), ("0", "positive"),
                       (0, "positive"), (True, "number of bytes"), ("1.5", "whole number"), (float("nan"), "whole"),
                       ("8GB8", "not a size"), ([8], "number of bytes")]:
        with pytest.raises(ValueError, match=words):
            parse_bytes(bad, "memory_budget")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return zoo.build("llama", tmp_path_factory.mktemp("llama"), dtype="float32")


def test_bad_budget_is_one_clear_error(llama):
    with pytest.raises(ValueError, match=r"memory_budget 'lots' is not a size"):
        workbench.load(llama, memory_budget="lots")
    with pytest.raises(ValueError, match=r"memory_budget 1000 bytes \(1000 B\) is below the weights of "
                                         r"(layers\.\d|embed_tokens)"):
        workbench.load(llama, memory_budget=1000)
    # a compute dtype whose converted copies do not fit is refused when it is asked for
    m = workbench.load(llama, memory_budget=workbench.load(llama, memory_budget="1GB").largest_segment.nbytes)
    with pytest.raises(ValueError, match=r"below the weights of layers\.\d .* in float16"):
        m.trace(IDS, dtype="float16")
    # the CLI: one line, exit 2
    assert cli_main(["hunt", str(llama), "--ids", "2,3", "--memory-budget", "lots"]) == 2
    assert cli_main(["hunt", str(llama), "--ids", "2,3", "--memory-budget", "64MB", "--json"]) == 0
    with pytest.raises(ValueError, match="progress must be None, True or False"):
        workbench.load(llama, memory_budget="1GB", progress="yes")


# ----------------------------------------------------------------------------- equal results

ARCHS = [("llama", {"dtype": "float32"}), ("gemma3_text", {}), ("gemma4_text", {"quant": "affine4"}),
         ("gemma4_kv", {})]


@pytest.mark.parametrize("arch,kw", ARCHS)
def test_streamed_equals_held(tmp_path, arch, kw):
    path = zoo.build(arch, tmp_path / arch, **kw)
    held = workbench.load(path)
    m = workbench.load(path, memory_budget="1GB")
    assert isinstance(m, StreamedModel)
    ids = mx.array([IDS])
    ref = held(ids)
    mx.eval(ref)
    # what is loaded at each segment end is one segment's tensors, nothing more
    segs = segments(m)
    seen = []
    release = m.release_weights

    names = []

    def spy():
        seen.append(sum(m.checkpoint.info(n).nbytes for n in m.loaded))
        names.append(set(m.loaded))
        release()

    m.release_weights = spy
    out = m(ids)
    assert np.array_equal(_np(out), _np(ref))
    assert len(seen) == len(segs)  # one release per segment
    assert max(seen) <= max(s.nbytes for s in segs)
    assert m.loaded == []
    # embedding lookups read their rows alone: no table is loaded whole by the first segment
    tables = {n for op in m.program.ops if op.kind == "embedding" for n in m.op_tensor_names(op)}
    assert tables and not tables & names[0]
    assert all(op.attrs.get("rows") for op in m.program.ops if op.kind == "embedding")
    if kw.get("quant"):  # packed weights stay packed
        assert m.weights()["layers.0.mlp.down_proj.weight"].dtype == mx.uint32
    m.release_weights = release
    # stats capture, and stepping one op at a time, stream too
    t = m.trace(IDS, capture="stats")
    t.run()
    assert np.array_equal(_np(t.logits[0]), _np(ref[0]))
    t2 = held.trace(IDS, capture="stats")
    t2.run()
    assert [s.stats for s in t.steps] == [s.stats for s in t2.steps]
    t = m.trace(IDS, capture=None)
    while not t.done:
        t.step()
    assert np.array_equal(_np(t.logits[0]), _np(ref[0]))
    t.back()
    t.step()
    assert np.array_equal(_np(t.logits[0]), _np(ref[0]))


@pytest.mark.parametrize("kw", [{"dtype": "bfloat16"}, {"quant": "affine4"}])
def test_rows_read_alone_equal_the_table(tmp_path, kw):
    from workbench.models.streaming import StreamingTensors

    ck = workbench.load(zoo.build("qwen3", tmp_path / "q", **kw)).checkpoint
    ids = mx.array([[5, 3, 3, 200, 4], [0, 255, 6, 5, 7]])
    st = StreamingTensors(ck, ck.lm_names())
    for name in ("embed_tokens.weight",) + (("embed_tokens.scales",) if kw.get("quant") else ()):
        got = st.rows(name, ids)
        want = ck.load(name)[ids]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(np.array(got.view(mx.uint8)), np.array(want.view(mx.uint8)))
    with pytest.raises(ValueError, match="embed_tokens.weight: token id 256 is out of range for its 256 rows"):
        st.rows("embed_tokens.weight", mx.array([[1, 256]]))
    from workbench.checkpoint.reader import CheckpointError
    with pytest.raises(CheckpointError, match="rows 1..256 outside its 256"):  # the reader checks too
        ck.load_rows("embed_tokens.weight", [1, 256])


def test_generation_streams(llama):
    held = workbench.load(llama)
    m = workbench.load(llama, memory_budget="64MB")
    g1 = workbench.generate(held, IDS, max_tokens=4, temperature=0.7, seed=3)
    g2 = workbench.generate(m, IDS, max_tokens=4, temperature=0.7, seed=3)
    assert g1.tokens == g2.tokens
    assert all(np.array_equal(_np(a.logits), _np(b.logits)) for a, b in zip(g1.traces, g2.traces))
    assert g2.traces[0].store.budget == m.capture_budget


def test_full_capture_spills_beyond_the_budget(llama, tmp_path):
    held = workbench.load(llama)
    probe = workbench.load(llama, memory_budget="1GB")
    largest = probe.largest_segment.nbytes
    m = workbench.load(llama, memory_budget=largest + 4096)  # 4 KiB left for captured values
    assert m.capture_budget == 4096
    t = m.trace(IDS, capture="full", storage=Storage(spill_dir=str(tmp_path / "spill")))
    t.run()
    ref = held.trace(IDS, capture="full")
    ref.run()
    assert t.store.memory_bytes <= 4096
    assert len(t.store.spilled) > len(m.program) // 2
    for name in m.program.names:
        assert np.array_equal(_np(t.value(name)), _np(ref.value(name))), name
    assert os.listdir(t.store.directory)


def test_hunt_recompute_streams(llama):
    held = workbench.load(llama)
    m = workbench.load(llama, memory_budget="64MB")
    t = m.trace(IDS, capture="stats")
    t.run()
    ref = held.trace(IDS, capture="stats")
    ref.run()
    name = "layers.2.mlp.down_proj"
    assert np.array_equal(_np(t.recompute(name, dtype=mx.float32)), _np(ref.recompute(name, dtype=mx.float32)))
    # the replay released what it read, segment by segment: only the recomputed op's own are left
    assert set(m.loaded) <= set(m.op_tensor_names(m.program[name]))


def test_progress_bar(llama, capsys, monkeypatch):
    from workbench import progress

    m = workbench.load(llama, memory_budget="64MB")
    m(mx.array([IDS]))  # automatic: stderr is not a terminal here, no notebook: nothing shown
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "DELAY", 0.0)
    m = workbench.load(llama, memory_budget="64MB", progress=True)
    t = m.trace(IDS)
    t.run()
    err = capsys.readouterr().err
    n = len(segments(m))
    assert f"segments: {n}/{n}, done" in err and err.endswith("\n")
    t = workbench.load(llama, memory_budget="64MB", progress=False).trace(IDS)
    t.run()
    assert capsys.readouterr().err == ""
    from workbench.trace.tracer import Trace, TraceError

    with pytest.raises(TraceError, match="progress must be None, True or False, not 'yes'"):
        Trace(m.program, m.context(), m.feeds(mx.array([IDS])), model=m, progress="yes")


def test_module_level_model_refuses_a_budget(llama):
    with pytest.raises(ValueError, match="memory_budget: streaming runs op programs"):
        workbench.load(llama, granularity="module", memory_budget="1GB")


# ----------------------------------------------------------------------------- peak memory

_CHILD = textwrap.dedent("""
    import json, sys
    import workbench
    import mlx.core as mx
    import numpy as np

    def status(key):  # /proc/self/status, kB
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    path, tiny, budget, out = sys.argv[1:5]
    ids = mx.array([[2, 15, 16, 17, 18, 19, 20, 21]])
    # warm-up on a tiny model: imports, kernels, the BLAS threads
    w = workbench.load(tiny, memory_budget=budget if budget != "none" else None)
    mx.eval(w(ids))
    t = w.trace(ids, capture="stats"); t.run(); del t, w
    mx.clear_cache()
    # the peak from here on: VmHWM reset to the current RSS (ru_maxrss would carry the parent's
    # peak over fork and exec)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    m = workbench.load(path, memory_budget=budget if budget != "none" else None)
    t = m.trace(ids, capture="stats")
    t.run()
    np.save(out, np.array(t.value("logits")))
    print(json.dumps({"growth": status("VmHWM") - base}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm (Linux)")
def test_peak_memory_on_a_checkpoint_twice_the_budget(tmp_path, llama):
    # float32 llama, 8 layers of 64 MiB (d=1024, ffn=4096): 514 MiB on disk
    path = zoo.build("llama", tmp_path / "big", dtype="float32", hidden_size=1024, intermediate_size=4096,
                     num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8)
    on_disk = sum(os.path.getsize(path / f) for f in os.listdir(path) if f.endswith(".safetensors"))
    budget = 200 * 2**20
    assert on_disk >= 2 * budget
    child = tmp_path / "child.py"
    child.write_text(_CHILD)

    def run(b, out):
        r = subprocess.run([sys.executable, str(child), str(path), str(llama), b, str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])["growth"]

    growth = run(str(budget), tmp_path / "streamed.npy")
    run("none", tmp_path / "held.npy")
    assert np.array_equal(np.load(tmp_path / "streamed.npy"), np.load(tmp_path / "held.npy"))
    # the bound, from the checkpoint's tensor sizes: the largest layer's tensors ...
    from workbench.checkpoint import open_checkpoint
    ck = open_checkpoint(path)
    per_layer = {}
    for n in ck.lm_names():
        layer = n.split(".")[1] if n.startswith("layers.") else n.split(".")[0]
        per_layer[layer] = per_layer.get(layer, 0) + ck.info(n).nbytes
    largest = max(per_layer.values())
    # ... + activations: [1, 8, 4096] float32 values, a few alive at once, and the logits
    activations = 16 * 8 * 4096 * 4 + 8 * ck.info("lm_head.weight").shape[0] * 4
    bound = (largest + activations) * 1.2
    print(f"peak RSS growth {growth / 2**20:.1f} MiB, bound {bound / 2**20:.1f} MiB "
          f"(largest layer {largest / 2**20:.1f} MiB, checkpoint {on_disk / 2**20:.0f} MiB, budget 200 MiB)")
    assert growth <= bound
    assert growth >= largest  # measured what it claims to: a layer's weights were in memory
