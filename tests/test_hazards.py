"""The hazard analyzer: every kind provoked at the right event with the right `other`,
no false positives on clean schedules, and a byte-level oracle on random schedules."""
from __future__ import annotations

import json
import random

import pytest

from workbench.buffers import KINDS, ScheduleError, analyze, load_schedule, validate
from workbench.cli import main as cli_main


def acc(buf, off, size, value=None, arg=None):
    d = {"buffer": buf, "offset": off, "size": size}
    if arg is not None:
        d["arg"] = arg
    if value is not None:
        d["value"] = value
    return d


def disp(name, reads=(), writes=(), kernel=None, cb=None):
    d = {"type": "dispatch", "name": name, "reads": list(reads), "writes": list(writes)}
    if kernel is not None:
        d["kernel"] = kernel
    if cb is not None:
        d["cb"] = cb
    return d


def sched(events, buffers=None, mode="serial", kernels=None):
    return {"format": "workbench.schedule/1", "mode": mode,
            "buffers": buffers if buffers is not None else {"in": {"size": 64, "initialized": True},
                                                            "a": {"size": 64}, "b": {"size": 64}},
            "kernels": kernels or {}, "events": events}


def found(doc):
    return [(h.kind, h.event, h.other, h.buffer, tuple(h.range) if h.range else None) for h in analyze(doc)]


# ------------------------------------------------------------------ each kind, provoked

def test_alias_in_dispatch_and_declared_inplace():
    ev = [disp("sdpa", [acc("in", 0, 64, "x", "q")], [acc("a", 0, 64, "attn", "out")], kernel="sdpa"),
          disp("o_proj", [acc("a", 0, 64, "attn", "x")], [acc("a", 0, 64, "o", "out")], kernel="qmm")]
    assert found(sched(ev)) == [("alias-in-dispatch", 1, None, "a", (0, 64))]
    h = analyze(sched(ev))[0]
    # names both dispatches, the buffer, the bytes, and what to do
    for part in ("dispatch 1 'o_proj'", "dispatch 0 'sdpa'", "buffer 'a'", "[0, 64)", "Give o_proj its own output buffer"):
        assert part in h.message
    # the same pair declared in-place for the kernel: accepted
    assert found(sched(ev, kernels={"qmm": {"inplace": [["x", "out"]]}})) == []
    # declared for another arg pair only: still a hazard
    assert found(sched(ev, kernels={"qmm": {"inplace": [["y", "out"]]}}))[0][0] == "alias-in-dispatch"


def test_partial_overlap_read_write_and_two_writes():
    ev = [disp("p", [acc("in", 0, 64, arg="x")], [acc("a", 0, 64, "v")]),
          disp("shift", [acc("a", 0, 32, "v", "x")], [acc("a", 16, 32, "w", "out")]),
          disp("two", [], [acc("b", 0, 40, arg="o1"), acc("b", 32, 32, arg="o2")])]
    assert found(sched(ev)) == [("partial-overlap", 1, None, "a", (16, 32)),
                                ("partial-overlap", 2, None, "b", (32, 40))]
    # two writes of exactly the same bytes are flagged too (what remains depends on timing)
    ev2 = [disp("two", [], [acc("b", 0, 8, arg="o1"), acc("b", 0, 8, arg="o2")])]
    assert found(sched(ev2)) == [("partial-overlap", 0, None, "b", (0, 8))]


def test_raw_war_waw_in_concurrent_region_with_latest_other():
    ev = [disp("w1", [acc("in", 0, 8)], [acc("a", 0, 16)]),        # 0
          disp("w2", [acc("in", 0, 8)], [acc("a", 16, 16)]),       # 1
          disp("r", [acc("a", 8, 16)], [acc("b", 0, 8)]),          # 2 raw with 1 (latest of 0, 1), bytes [16, 24)
          disp("war", [acc("in", 0, 8)], [acc("in", 0, 4)]),       # 3 war with 2? no: reads of 'in' by 0,1 and 3 itself
          {"type": "barrier"},                                      # 4
          disp("after", [acc("a", 0, 32)], [acc("b", 0, 8)]),       # 5 clean: barrier
          disp("waw", [acc("in", 32, 8)], [acc("b", 4, 8)])]        # 6 waw with 5
    got = found(sched(ev, mode="concurrent", buffers={"in": {"size": 64, "initialized": True},
                                                         "a": {"size": 64}, "b": {"size": 64}}))
    # dispatch 3 reads in[0:8] and writes in[0:4]: inside itself that is a partial overlap, and
    # against the region it is a war with the latest earlier reader of in[0:4], dispatch 1
    assert ("raw", 2, 1, "a", (16, 24)) in got
    assert ("war", 3, 1, "in", (0, 4)) in got
    assert ("partial-overlap", 3, None, "in", (0, 4)) in got
    assert ("waw", 6, 5, "b", (4, 8)) in got
    assert [g for g in got if g[1] == 5] == []
    assert len(got) == 4
    # the same stream in serial mode: only the in-dispatch overlap remains
    assert found(sched(ev, mode="serial")) == [("partial-overlap", 3, None, "in", (0, 4))]


def test_war_message_and_cb_change_ends_region():
    ev = [disp("q_proj", [acc("a", 0, 8, arg="x")], [acc("b", 0, 8, arg="out")], cb=0),
          disp("norm", [acc("in", 0, 8, arg="x")], [acc("a", 0, 8, arg="out")], cb=0)]
    bufs = {"in": {"size": 64, "initialized": True}, "a": {"size": 64, "initialized": True}, "b": {"size": 64}}
    hz = analyze(sched(ev, mode="concurrent", buffers=bufs))
    assert [(h.kind, h.event, h.other) for h in hz] == [("war", 1, 0)]
    assert "dispatch 1 'norm'" in hz[0].message and "dispatch 0 'q_proj'" in hz[0].message
    assert "barrier" in hz[0].message
    ev[1]["cb"] = 1  # a new command buffer starts a new region
    assert found(sched(ev, mode="concurrent", buffers=bufs)) == []


def test_stale_read_names_the_clobbering_dispatch():
    ev = [disp("embed", [acc("in", 0, 8)], [acc("a", 0, 32, "h0")]),               # 0
          disp("norm", [acc("a", 0, 32, "h0")], [acc("b", 0, 32, "n0")]),           # 1
          disp("o_proj", [acc("b", 0, 32, "n0", "x")], [acc("a", 0, 16, "o0")]),    # 2 overwrites half of h0
          disp("add", [acc("a", 0, 32, "h0", "a"), acc("b", 0, 32, "n0", "b")], [acc("b", 0, 32, "h1")])]
    got = found(sched(ev))
    # add also writes h1 over its own input n0 (b[0:32]), an alias-in-dispatch
    assert sorted(got, key=str) == sorted([("stale-read", 3, 2, "a", (0, 16)),
                                           ("alias-in-dispatch", 3, None, "b", (0, 32))], key=str)
    h = [h for h in analyze(sched(ev)) if h.kind == "stale-read"][0]
    for part in ("dispatch 3 'add'", "dispatch 2 'o_proj'", "'h0'", "'o0'", "buffer 'a'", "[0, 16)", "Give o_proj its own"):
        assert part in h.message
    # host-initialized bytes and unlabelled writes are not judged
    ev2 = [disp("p", [acc("in", 0, 8, "anything")], [acc("a", 0, 8)]),
           disp("q", [acc("a", 0, 8, "whatever")], [acc("b", 0, 8, "x")])]
    assert found(sched(ev2)) == []


def test_use_after_free_realloc_and_double_free():
    ev = [disp("p", [acc("in", 0, 8)], [acc("a", 0, 8, "v")]),   # 0
          {"type": "free", "buffer": "a"},                        # 1
          disp("q", [acc("a", 0, 8, "v")], [acc("b", 0, 8)]),     # 2 use-after-free, other 1
          {"type": "alloc", "buffer": "a", "size": 16},           # 3
          disp("r", [], [acc("a", 0, 16)]),                       # 4 fine
          {"type": "free", "buffer": "a"},                        # 5
          {"type": "free", "buffer": "a"}]                        # 6 double free, other 5
    assert found(sched(ev)) == [("use-after-free", 2, 1, "a", (0, 8)), ("use-after-free", 6, 5, "a", (0, 16))]


def test_out_of_bounds_other_is_alloc():
    ev = [disp("p", [acc("in", 60, 8)], [acc("a", 0, 8)]),      # 0 oob read, declared buffer: other None
          {"type": "alloc", "buffer": "t", "size": 10},          # 1
          disp("q", [acc("a", 0, 8)], [acc("t", 4, 8)])]         # 2 oob write, other 1
    assert found(sched(ev)) == [("out-of-bounds", 0, None, "in", (60, 68)), ("out-of-bounds", 2, 1, "t", (4, 12))]
    msg = analyze(sched(ev))[1].message
    assert "only 10 bytes" in msg and "at least 12 bytes" in msg


def test_uninitialized_read_gap_range():
    ev = [disp("p", [acc("in", 0, 8)], [acc("a", 8, 8)]),              # 0
          disp("q", [acc("a", 0, 24)], [acc("b", 0, 8)]),              # 1 bytes [0,8) and [16,24) never written
          {"type": "alloc", "buffer": "c", "size": 8},                 # 2
          disp("r", [acc("c", 0, 8)], [acc("b", 8, 8)]),               # 3 other = alloc 2
          {"type": "alloc", "buffer": "d", "size": 8, "initialized": True},
          disp("s", [acc("d", 0, 8)], [acc("b", 16, 8)])]              # 5 fine
    got = found(sched(ev))
    assert got == [("uninitialized-read", 1, None, "a", (0, 24)), ("uninitialized-read", 3, 2, "c", (0, 8))]
    assert "16 of them unwritten" in analyze(sched(ev))[0].message


def test_cb_reuse_dispatch_and_commit():
    ev = [disp("a", [acc("in", 0, 8)], [acc("a", 0, 8)], cb=1),   # 0
          {"type": "commit", "cb": 1},                           # 1
          {"type": "complete", "cb": 1},                         # 2
          disp("lm_head", [acc("a", 0, 8)], [acc("b", 0, 8)], cb=1),   # 3 cb-reuse, other 1
          {"type": "commit", "cb": 1},                           # 4 cb-reuse, other 1
          disp("c", [acc("a", 0, 8)], [acc("b", 0, 8)], cb=2),   # 5 fine
          {"type": "commit", "cb": 2}]
    assert found(sched(ev)) == [("cb-reuse", 3, 1, None, None), ("cb-reuse", 4, 1, None, None)]
    assert "command buffer 1" in analyze(sched(ev))[0].message


# ------------------------------------------------------------------ no false positives

def transformer(mode, layers=4, d=64, barriers=True, attn_buf="attnH"):
    """A clean engine-like schedule; attn_buf='h' plants the seed's bug (attention output over its input)."""
    H = d * 2
    bufs = {"w": {"size": layers * 8 * H * d, "initialized": True}, "x": {"size": H, "initialized": True},
            "h": {"size": H}, "q": {"size": H}, "k": {"size": H}, "v": {"size": H}, "attnH": {"size": H},
            "o": {"size": H}, "g": {"size": 4 * H}, "u": {"size": 4 * H}}
    ev = []
    bar = (lambda: ev.append({"type": "barrier"})) if (barriers and mode == "concurrent") else (lambda: None)
    res = "emb"
    for L in range(layers):
        w0, p = L * 8 * H * d, f"layers.{L}"
        ev.append(disp(f"{p}.input_layernorm", [acc("x", 0, H, res, "x")], [acc("h", 0, H, f"{p}.n", "out")], "rms", 0)); bar()
        for j, t in enumerate("qkv"):
            ev.append(disp(f"{p}.self_attn.{t}_proj", [acc("h", 0, H, f"{p}.n", "x"), acc("w", w0 + j * H * d, H * d, arg="w")],
                           [acc(t, 0, H, f"{p}.{t}", "out")], "qmv", 0))
        bar()
        ev.append(disp(f"{p}.self_attn.sdpa", [acc("q", 0, H, f"{p}.q", "q"), acc("k", 0, H, f"{p}.k", "k"),
                                               acc("v", 0, H, f"{p}.v", "v")],
                       [acc(attn_buf, 0, H, f"{p}.attn", "out")], "sdpa", 0)); bar()
        ev.append(disp(f"{p}.self_attn.o_proj", [acc(attn_buf, 0, H, f"{p}.attn", "x"), acc("w", w0 + 3 * H * d, H * d, arg="w")],
                       [acc("o", 0, H, f"{p}.o", "out")], "qmv", 0)); bar()
        ev.append(disp(f"{p}.add", [acc("x", 0, H, res, "a"), acc("o", 0, H, f"{p}.o", "b")], [acc("x", 0, H, f"{p}.mid", "out")], "add", 0)); bar()
        ev.append(disp(f"{p}.post_attention_layernorm", [acc("x", 0, H, f"{p}.mid", "x")], [acc("h", 0, H, f"{p}.n2", "out")], "rms", 0)); bar()
        ev.append(disp(f"{p}.mlp.gate_proj", [acc("h", 0, H, f"{p}.n2", "x")], [acc("g", 0, 4 * H, f"{p}.g", "out")], "qmv", 0))
        ev.append(disp(f"{p}.mlp.up_proj", [acc("h", 0, H, f"{p}.n2", "x")], [acc("u", 0, 4 * H, f"{p}.u", "out")], "qmv", 0)); bar()
        ev.append(disp(f"{p}.mlp.act", [acc("g", 0, 4 * H, f"{p}.g", "a"), acc("u", 0, 4 * H, f"{p}.u", "b")],
                       [acc("g", 0, 4 * H, f"{p}.act", "out")], "mul", 0)); bar()
        ev.append(disp(f"{p}.mlp.down_proj", [acc("g", 0, 4 * H, f"{p}.act", "x")], [acc("o", 0, H, f"{p}.down", "out")], "qmv", 0)); bar()
        ev.append(disp(p, [acc("x", 0, H, f"{p}.mid", "a"), acc("o", 0, H, f"{p}.down", "b")], [acc("x", 0, H, p, "out")], "add", 0)); bar()
        res = p
    ev.append({"type": "commit", "cb": 0})
    ev.append({"type": "complete", "cb": 0})
    kern = {"add": {"inplace": [["a", "out"]]}, "mul": {"inplace": [["a", "out"]]}}
    return sched(ev, buffers=bufs, mode=mode, kernels=kern)


@pytest.mark.parametrize("mode", ["serial", "concurrent"])
def test_clean_engine_schedule_has_no_hazards(mode):
    assert analyze(transformer(mode)) == []


def test_concurrent_without_barriers_is_caught():
    got = found(transformer("concurrent", barriers=False))
    kinds = {g[0] for g in got}
    assert {"raw", "war", "waw"} <= kinds
    first = got[0]
    # layer 0: q_proj reads h, which input_layernorm (event 0) writes in the same region
    assert first[:4] == ("raw", 1, 0, "h")


def test_seed_case_attention_output_over_its_input():
    doc = transformer("serial", attn_buf="q")   # sdpa writes its output over q, which it reads
    got = found(doc)
    assert got[0] == ("alias-in-dispatch", 4, None, "q", (0, 128))
    assert doc["events"][4]["name"] == "layers.0.self_attn.sdpa"
    assert "Give layers.0.self_attn.sdpa its own output buffer" in analyze(doc)[0].message


# ------------------------------------------------------------------ oracle on random schedules

def oracle(doc):
    """Byte-by-byte reference for the memory and region kinds (small buffers only)."""
    bufs = {b: {"size": s["size"], "init": s.get("initialized", False), "alloc": None, "live": True, "freed": None,
                "mem": [None] * s["size"]} for b, s in doc["buffers"].items()}
    conc = doc["mode"] == "concurrent"
    out = set()
    rr, rw = {}, {}
    for i, e in enumerate(doc["events"]):
        t = e["type"]
        if t in ("barrier", "commit"):
            rr, rw = {}, {}
        elif t == "alloc":
            bufs[e["buffer"]] = {"size": e["size"], "init": e.get("initialized", False), "alloc": i, "live": True,
                                 "freed": None, "mem": [None] * e["size"]}
        elif t == "free":
            b = bufs[e["buffer"]]
            if not b["live"]:
                out.add(("use-after-free", i, b["freed"], e["buffer"], (0, b["size"])))
            else:
                b["live"], b["freed"], b["mem"] = False, i, [None] * b["size"]
        elif t == "dispatch":
            def parts(lst):
                res = []
                for a in lst:
                    b = bufs[a["buffer"]]
                    s, en = a["offset"], a["offset"] + a["size"]
                    if not b["live"]:
                        out.add(("use-after-free", i, b["freed"], a["buffer"], (s, en)))
                        continue
                    if en > b["size"]:
                        out.add(("out-of-bounds", i, b["alloc"], a["buffer"], (s, en)))
                    res.append((a, range(s, min(en, b["size"]))))
                return res
            R, W = parts(e["reads"]), parts(e["writes"])
            for a, rng in R:
                b = bufs[a["buffer"]]
                gaps = [x for x in rng if b["mem"][x] is None]
                if gaps and not b["init"]:
                    out.add(("uninitialized-read", i, b["alloc"], a["buffer"], (gaps[0], gaps[-1] + 1)))
                if a.get("value") is not None:
                    by = {}
                    for x in rng:
                        m = b["mem"][x]
                        if m is not None and m[1] is not None and m[1] != a["value"]:
                            by.setdefault(m[0], []).append(x)
                    for w, xs in by.items():
                        out.add(("stale-read", i, w, a["buffer"], (xs[0], xs[-1] + 1)))
            if conc:
                for a, rng, kind, maps in [(a, r, "raw", [rw]) for a, r in R] + \
                        [(a, r, k, [m]) for a, r in W for k, m in (("war", rr), ("waw", rw))]:
                    m = maps[0].get(a["buffer"], {})
                    hits = {x: m[x] for x in rng if x in m}
                    if hits:
                        o = max(hits.values())
                        xs = sorted(x for x, v in hits.items() if v == o)
                        out.add((kind, i, o, a["buffer"], (xs[0], xs[-1] + 1)))
                for a, rng in R:
                    for x in rng:
                        rr.setdefault(a["buffer"], {})[x] = i
                for a, rng in W:
                    for x in rng:
                        rw.setdefault(a["buffer"], {})[x] = i
            for a, rng in W:
                for x in rng:
                    bufs[a["buffer"]]["mem"][x] = (i, a.get("value"))
    return out


def random_schedule(rng: random.Random, mode: str):
    bufs = {f"b{k}": {"size": rng.randint(1, 24), "initialized": rng.random() < 0.3} for k in range(3)}
    labels = ["v0", "v1", "v2", None]
    ev = []
    for i in range(rng.randint(1, 25)):
        r = rng.random()
        if r < 0.1:
            ev.append({"type": "barrier"} if r < 0.07 else {"type": "commit", "cb": i})
        elif r < 0.15:
            ev.append({"type": "free", "buffer": rng.choice(list(bufs))})
        elif r < 0.2:
            ev.append({"type": "alloc", "buffer": rng.choice(list(bufs)), "size": rng.randint(1, 24),
                       "initialized": rng.random() < 0.3})
        else:
            def a(n):
                return [acc(rng.choice(list(bufs)), rng.randint(0, 20), rng.randint(1, 8), rng.choice(labels), f"x{j}")
                        for j in range(n)]
            ev.append(disp(f"op{i}", a(rng.randint(0, 2)), a(rng.randint(0, 1)), kernel="k"))
    return sched(ev, buffers=bufs, mode=mode)


@pytest.mark.parametrize("mode", ["serial", "concurrent"])
def test_analyzer_matches_byte_level_oracle(mode):
    rng = random.Random(1234 if mode == "serial" else 4321)
    checked = 0
    for _ in range(400):
        doc = random_schedule(rng, mode)
        keep = {"stale-read", "uninitialized-read", "raw", "war", "waw", "use-after-free", "out-of-bounds"}
        got = {g for g in found(doc) if g[0] in keep}
        want = oracle(doc)
        assert got == want, json.dumps(doc)
        checked += len(want)
    assert checked > 100  # the random schedules really do contain hazards of these kinds


# ------------------------------------------------------------------ validation and CLI

BAD = [
    ({"format": "other/1", "mode": "serial", "events": []}, "format"),
    ({"format": "workbench.schedule/1", "mode": "parallel", "events": []}, "mode"),
    ({"format": "workbench.schedule/1", "mode": "serial", "buffers": {"a": {"size": -1}}, "events": []}, 'buffers["a"].size'),
    ({"format": "workbench.schedule/1", "mode": "serial", "buffers": {"a": {"size": 8}},
      "events": [{"type": "barrier"}, disp("x", [acc("a", -4, 8)])]}, "events[1].reads[0].offset (dispatch 'x')"),
    ({"format": "workbench.schedule/1", "mode": "serial", "buffers": {"a": {"size": 8}},
      "events": [disp("x", [], [acc("a", 0, True)])]}, "events[0].writes[0].size"),
    ({"format": "workbench.schedule/1", "mode": "serial", "buffers": {"a": {"size": 8}},
      "events": [disp("x", [{"buffer": "a", "offest": 0, "size": 8}])]}, "events[0].reads[0].offest"),
    ({"format": "workbench.schedule/1", "mode": "serial", "buffers": {},
      "events": [disp("x", [acc("nope", 0, 8)])]}, "events[0].reads[0].buffer"),
    ({"format": "workbench.schedule/1", "mode": "serial", "events": [{"type": "commit"}]}, "events[0].cb"),
    ({"format": "workbench.schedule/1", "mode": "serial", "events": [{"type": "launch"}]}, "events[0].type"),
    ({"format": "workbench.schedule/1", "mode": "serial", "events": [{"type": "alloc", "buffer": "t"}]}, "events[0].size"),
    ({"format": "workbench.schedule/1", "mode": "serial", "events": [{"type": "dispatch"}]}, "events[0].name"),
    ({"format": "workbench.schedule/1", "mode": "serial", "events": {}}, "events"),
]


@pytest.mark.parametrize("doc,where", BAD)
def test_invalid_schedules_name_event_and_field(doc, where, tmp_path, capsys):
    with pytest.raises(ScheduleError) as ei:
        validate(doc)
    assert str(ei.value).startswith(where)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    before = p.read_bytes()
    assert cli_main(["hazards", str(p)]) == 2
    err = capsys.readouterr().err
    assert where in err and "Traceback" not in err and err.count("\n") == 1
    assert p.read_bytes() == before


def test_cli_exit_codes_and_json(tmp_path, capsys):
    clean, bad = tmp_path / "clean.json", tmp_path / "bad.json"
    clean.write_text(json.dumps(transformer("concurrent")))
    bad.write_text(json.dumps(transformer("serial", attn_buf="q")))
    assert cli_main(["hazards", str(clean)]) == 0
    assert "no hazards" in capsys.readouterr().out
    assert cli_main(["hazards", str(bad), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["hazards"][0]["kind"] == "alias-in-dispatch" and rep["hazards"][0]["event"] == 4
    assert set(rep["hazards"][0]) == {"kind", "event", "other", "buffer", "range", "message"}
    assert cli_main(["hazards", str(bad)]) == 1
    assert "layers.0.self_attn.sdpa" in capsys.readouterr().out
    assert cli_main(["hazards", str(tmp_path / "missing.json"), "--json"]) == 2
    assert "no such file" in json.loads(capsys.readouterr().out)["error"]
    (tmp_path / "nan.json").write_text('{"format": NaN}')
    assert cli_main(["hazards", str(tmp_path / "nan.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_load_schedule_roundtrip(tmp_path):
    doc = transformer("concurrent")
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    sch = load_schedule(p)
    again = tmp_path / "again.json"
    sch.save(again)
    assert analyze(load_schedule(again)) == [] and len(load_schedule(again).events) == len(doc["events"])
    assert set(KINDS) >= {h.kind for h in analyze(transformer("concurrent", barriers=False))}


def test_command_line_subprocess(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(sched([disp("x", [acc("a", -1, 8)])])))
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "hazards", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith("events[0].reads[0].offset (dispatch 'x'): expected a byte count "
                                     "(a non-negative integer), got -1")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(transformer("serial")))
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "hazards", str(good), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["hazards"] == []


def test_cli_groups_runs_from_one_commit(tmp_path, capsys):
    ev = [disp("a", [acc("in", 0, 8)], [acc("a", 0, 8)], cb=0), {"type": "commit", "cb": 0}]
    ev += [disp(f"late{i}", [acc("in", 0, 8)], [acc("b", 0, 8)], cb=0) for i in range(5)]
    p = tmp_path / "s.json"
    p.write_text(json.dumps(sched(ev)))
    assert cli_main(["hazards", str(p)]) == 1
    out = capsys.readouterr().out
    assert "5 hazards (5 cb-reuse)" in out and "event 2 cb-reuse (with event 1)" in out
    assert "... and 4 more cb-reuse with event 1 in a row (events 3..6)" in out
    assert cli_main(["hazards", str(p), "--json"]) == 1
    assert [h["event"] for h in json.loads(capsys.readouterr().out)["hazards"]] == [2, 3, 4, 5, 6]
