"""Benchmark: analyse a 100k-event schedule (load + validate + analyse), print the time.

    python benchmarks/bench_hazards.py [--events N] [--mode concurrent|serial]
    python benchmarks/bench_hazards.py --hostile    # the hostile schedules, CPU seconds each
    python benchmarks/bench_hazards.py --smoke [--hostile]    # CI: 2,000 events

The schedule imitates an engine decoding token by token: per layer, norm -> q/k/v
projections (concurrent, then a barrier) -> attention over a growing KV cache -> o_proj ->
residual add -> MLP, each reading a slice of one big initialized weight buffer; one
command buffer per token (commit + complete).  One deliberate alias is planted at the
end so the analyzer has something to find; the run asserts it is found.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import workbench  # noqa: F401  (fast BLAS before mlx.core)
from workbench.buffers import analyze, load_schedule, validate


def make(n_events: int, mode: str, d: int = 2048, layers: int = 32, ctx: int = 4096) -> dict:
    f = 2  # bytes per element
    H = d * f
    bufs = {"weights": {"size": layers * 12 * d * d * f, "initialized": True},
            "x": {"size": H, "initialized": True}, "h": {"size": H}, "q": {"size": H}, "k": {"size": H},
            "v": {"size": H}, "attnH": {"size": H}, "o": {"size": H}, "g": {"size": 4 * H}, "u": {"size": 4 * H},
            "kv": {"size": layers * 2 * ctx * H}}
    ev: list[dict] = []
    wsz = d * d * f

    def disp(name, kernel, cb, reads, writes):
        ev.append({"type": "dispatch", "name": name, "kernel": kernel, "cb": cb,
                   "reads": [{"arg": a, "buffer": b, "offset": o, "size": s, **({"value": v} if v else {})}
                             for a, b, o, s, v in reads],
                   "writes": [{"arg": a, "buffer": b, "offset": o, "size": s, "value": v} for a, b, o, s, v in writes]})

    def bar():
        if mode == "concurrent":
            ev.append({"type": "barrier"})

    tok = 0
    resid = "input"
    while len(ev) < n_events - 40:
        cb = tok
        for L in range(layers):
            p = f"t{tok}.layers.{L}"
            w0 = L * 12 * wsz
            disp(f"{p}.input_layernorm", "rmsnorm", cb, [("x", "x", 0, H, resid)], [("out", "h", 0, H, f"{p}.norm")])
            bar()
            for j, t in enumerate("qkv"):
                disp(f"{p}.self_attn.{t}_proj", "qmv", cb, [("x", "h", 0, H, f"{p}.norm"), ("w", "weights", w0 + j * wsz, wsz, None)],
                     [("out", t, 0, H, f"{p}.{t}")])
            bar()
            kvo = (L * 2 * ctx + (tok % ctx)) * H
            disp(f"{p}.self_attn.cache", "kv_append", cb, [("k", "k", 0, H, f"{p}.k"), ("v", "v", 0, H, f"{p}.v")],
                 [("kc", "kv", kvo, H, None), ("vc", "kv", kvo + ctx * H, H, None)])
            bar()
            n = min(tok + 1, ctx)
            disp(f"{p}.self_attn.sdpa", "sdpa", cb, [("q", "q", 0, H, f"{p}.q"), ("kc", "kv", L * 2 * ctx * H, n * H, None),
                                                    ("vc", "kv", (L * 2 + 1) * ctx * H, n * H, None)],
                 [("out", "attnH", 0, H, f"{p}.attn")])
            bar()
            disp(f"{p}.self_attn.o_proj", "qmv", cb, [("x", "attnH", 0, H, f"{p}.attn"), ("w", "weights", w0 + 3 * wsz, wsz, None)],
                 [("out", "o", 0, H, f"{p}.o")])
            bar()
            disp(f"{p}.add1", "add", cb, [("a", "x", 0, H, resid), ("b", "o", 0, H, f"{p}.o")], [("out", "x", 0, H, f"{p}.mid")])
            bar()
            disp(f"{p}.post_attention_layernorm", "rmsnorm", cb, [("x", "x", 0, H, f"{p}.mid")], [("out", "h", 0, H, f"{p}.norm2")])
            bar()
            disp(f"{p}.mlp.gate_proj", "qmv", cb, [("x", "h", 0, H, f"{p}.norm2"), ("w", "weights", w0 + 4 * wsz, 4 * wsz, None)],
                 [("out", "g", 0, 4 * H, f"{p}.gate")])
            disp(f"{p}.mlp.up_proj", "qmv", cb, [("x", "h", 0, H, f"{p}.norm2"), ("w", "weights", w0 + 8 * wsz, 4 * wsz, None)],
                 [("out", "u", 0, 4 * H, f"{p}.up")])
            bar()
            disp(f"{p}.mlp.act", "gelu_mul", cb, [("a", "g", 0, 4 * H, f"{p}.gate"), ("b", "u", 0, 4 * H, f"{p}.up")],
                 [("out", "g", 0, 4 * H, f"{p}.act")])
            bar()
            disp(f"{p}.mlp.down_proj", "qmv", cb, [("x", "g", 0, 4 * H, f"{p}.act"), ("w", "weights", w0, 4 * wsz, None)],
                 [("out", "o", 0, H, f"{p}.down")])
            bar()
            disp(f"{p}.add2", "add", cb, [("a", "x", 0, H, f"{p}.mid"), ("b", "o", 0, H, f"{p}.down")], [("out", "x", 0, H, p)])
            bar()
            resid = p
            if len(ev) >= n_events - 40:
                break
        ev.append({"type": "commit", "cb": cb})
        ev.append({"type": "complete", "cb": cb})
        tok += 1
    # the planted bug: o_proj writing into its own input (the seed's attnH case)
    disp("planted.o_proj", "qmv", tok, [("x", "attnH", 0, H, None), ("w", "weights", 0, wsz, None)], [("out", "attnH", 0, H, "bad")])
    ev.append({"type": "commit", "cb": tok})
    return {"format": "workbench.schedule/1", "mode": mode, "buffers": bufs,
            "kernels": {"add": {"inplace": [["a", "out"], ["b", "out"]]}, "gelu_mul": {"inplace": [["a", "out"]]}},
            "events": ev}


def hostile(n: int) -> None:
    """Time the hostile schedules of tests/test_hazards_hostile.py (n events each)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("hostile", os.path.join(here, "..", "tests", "test_hazards_hostile.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, make_doc in mod.HOSTILE.items():
        doc = make_doc(n)
        c0 = time.process_time()
        sch = validate(doc)
        c1 = time.process_time()
        hz = analyze(sch)
        c2 = time.process_time()
        print(f"{name:<18} {len(sch.events):>7} events: validate {c1 - c0:5.2f}s, analyse {c2 - c1:5.2f}s CPU; "
              f"{len(hz)} hazards")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--mode", default="concurrent", choices=["serial", "concurrent"])
    ap.add_argument("--hostile", action="store_true",
                    help="time the hostile schedules instead (100k identical reads, 100k concurrent dispatches, "
                         "reads clobbered by every earlier writer)")
    ap.add_argument("--smoke", action="store_true", help="CI: 2,000 events (that it runs, not how fast)")
    a = ap.parse_args()
    if a.smoke:
        a.events = 2000
    if a.hostile:
        hostile(a.events)
        return
    doc = make(a.events, a.mode)
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "bench.schedule.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        mb = os.path.getsize(path) / 1e6
        t0, c0 = time.perf_counter(), time.process_time()
        sch = load_schedule(path)
        t1, c1 = time.perf_counter(), time.process_time()
        hz = analyze(sch)
        t2, c2 = time.perf_counter(), time.process_time()
    n_acc = sum(len(e.reads) + len(e.writes) for e in sch.events)
    kinds = sorted({h.kind for h in hz})
    assert kinds == ["alias-in-dispatch"] and hz[0].event == len(sch.events) - 2, hz[:3]
    print(f"{len(sch.events)} events ({n_acc} accesses, mode {a.mode}, {mb:.1f} MB JSON): "
          f"load+validate {t1 - t0:.2f}s, analyse {t2 - t1:.2f}s, total {t2 - t0:.2f}s wall "
          f"({c2 - c0:.2f}s CPU; {len(sch.events) / max(c2 - c0, 1e-9):,.0f} events per CPU second; "
          f"target 100k events < 10s: {10 / max(t2 - t0, 1e-9):.1f}x headroom); "
          f"found {len(hz)} hazard(s): {', '.join(kinds)} (the planted one)")


if __name__ == "__main__":
    main()
