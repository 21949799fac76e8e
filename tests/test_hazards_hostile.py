"""Hostile schedules answer in bounded time and output: 100k identical reads in one
dispatch, 100k concurrent dispatches without barriers, reads that every earlier writer
clobbered; and schedule files that are not regular files, or too large, are refused
before reading.  The wide-query trees agree with the byte-level oracle."""
from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import time

import pytest

from workbench.buffers import analyze, load_schedule, ScheduleError

N = 100_000


def acc(buf, off, size, value=None):
    d = {"buffer": buf, "offset": off, "size": size}
    if value is not None:
        d["value"] = value
    return d


def disp(name, reads=(), writes=()):
    return {"type": "dispatch", "name": name, "reads": list(reads), "writes": list(writes)}


def sched(events, buffers, mode="serial"):
    return {"format": "workbench.schedule/1", "mode": mode, "buffers": buffers, "events": events}


def identical_reads(n):
    """One dispatch reading the same bytes n times (and writing them)."""
    return sched([disp("big", [acc("a", 0, 64, "x")] * n, [acc("a", 0, 64, "y")])], {"a": {"size": 64}})


def concurrent_same(n):
    """n dispatches in one concurrent region, each reading and writing the same bytes."""
    return sched([disp(f"d{i}", [acc("in", 0, 64), acc("a", 0, 64)], [acc("a", 0, 64), acc("in", 0, 64)])
                  for i in range(n)], {"in": {"size": 64, "initialized": True}, "a": {"size": 64}}, "concurrent")


def concurrent_pieces(n):
    """n dispatches in one region, each reading the whole buffer and writing its own 8 bytes:
    every read meets every earlier writer of the region."""
    return sched([disp(f"d{i}", [acc("a", 0, 8 * n)], [acc("a", 8 * i, 8)]) for i in range(n)],
                 {"a": {"size": 8 * n, "initialized": True}}, "concurrent")


def stale_fan(n):
    """n/2 dispatches each overwrite 8 bytes with their own label, then n/2 reads of the whole
    buffer expecting another: each read has n/2 clobbering writers."""
    k = n // 2
    ev = [disp(f"w{i}", [], [acc("a", 8 * i, 8, f"v{i}")]) for i in range(k)]
    ev += [disp(f"r{i}", [acc("a", 0, 8 * k, "x")], [acc("b", 0, 8)]) for i in range(k)]
    return sched(ev, {"a": {"size": 8 * k}, "b": {"size": 8}})


def stale_interleaved(n):
    """Writes and whole-buffer reads alternating (nothing can be cached between reads),
    over a buffer half of which is never written."""
    k = n // 2
    ev = []
    for i in range(k):
        ev.append(disp(f"w{i}", [], [acc("a", 16 * i, 8, f"v{i}")]))
        ev.append(disp(f"r{i}", [acc("a", 0, 16 * k, "x")], [acc("b", 0, 8)]))
    return sched(ev, {"a": {"size": 16 * k}, "b": {"size": 8}})


HOSTILE = {"identical_reads": identical_reads, "concurrent_same": concurrent_same,
           "concurrent_pieces": concurrent_pieces, "stale_fan": stale_fan, "stale_interleaved": stale_interleaved}


def _run(args, timeout=300):
    """Run the CLI in a subprocess: (completed process, its CPU seconds).  CPU time, not wall
    time: the bound holds on a machine busy with other work too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                       timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_schedule_bounded_time_and_output(case, tmp_path):
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(HOSTILE[case](N)))
    p, cpu = _run(["hazards", str(path), "--json"])
    assert p.returncode == 1, p.stderr[-2000:]
    assert cpu < 20, f"{case}: {cpu:.1f} CPU seconds"
    out = json.loads(p.stdout)
    # bounded output: at most --max-json (10,000) hazards of each kind, the rest counted
    assert len(p.stdout) < 10 * 10_000 * 1000, (case, len(p.stdout))
    assert all(n <= 10_000 for n in _kinds(out["hazards"]).values())
    assert {k: _kinds(out["hazards"]).get(k, 0) + out["omitted"].get(k, 0) for k in out["counts"]} == out["counts"]
    # a stale read names at most MAX_WRITERS (4) writers
    per_read: dict = {}
    for h in out["hazards"]:
        if h["kind"] == "stale-read":
            per_read[h["event"]] = per_read.get(h["event"], 0) + 1
    assert max(per_read.values(), default=0) <= 4
    if case.startswith("stale"):
        # every read names 4 writers (the first reads of stale_interleaved have only 1, 2 and 3 before them)
        assert out["counts"]["stale-read"] == 4 * (N // 2) - (6 if case == "stale_interleaved" else 0)
        stale = [h for h in out["hazards"] if h["kind"] == "stale-read"]
        noted = [h for h in stale if "more dispatch(es)" in h["message"] and "only the first 4 are listed" in h["message"]]
        assert len(noted) >= 2000  # each read past the first few: its last listed writer counts the rest
        assert all(h["other"] == max(g["other"] for g in stale if g["event"] == h["event"]) for h in noted[:50])
    if case == "identical_reads":  # one finding per distinct access, not 100k
        assert out["counts"] == {"alias-in-dispatch": 1, "uninitialized-read": 1}
    if case == "concurrent_pieces":  # every read after the first meets the latest writer of the region
        assert out["counts"]["raw"] == N - 1
        raw = [h for h in out["hazards"] if h["kind"] == "raw"]
        assert all(h["other"] == h["event"] - 1 and h["range"] == [8 * h["other"], 8 * h["event"]] for h in raw)
    # everything, on request: --max-json 0
    if case == "identical_reads":
        p, _ = _run(["hazards", str(path), "--json", "--max-json", "0"])
        assert json.loads(p.stdout)["omitted"] == {}


def _kinds(hazards):
    out: dict = {}
    for h in hazards:
        out[h["kind"]] = out.get(h["kind"], 0) + 1
    return out


def test_stale_read_names_at_most_max_writers_and_counts_the_rest():
    doc = stale_fan(40)  # 20 writers, 20 reads
    hz = [h for h in analyze(doc) if h.kind == "stale-read"]
    first = [h for h in hz if h.event == 20]
    assert [h.other for h in first] == list(range(4)) and first[0].range == (0, 8)
    assert "16 more dispatch(es) (events 4..19)" in first[-1].message
    assert all("more dispatch" not in h.message for h in first[:-1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tree_path_matches_the_oracle(monkeypatch, seed):
    """The wide-query trees (forced for every query) give exactly the oracle's hazards."""
    import importlib
    from test_hazards import oracle, random_schedule  # tests/ is on the path (pytest's rootdir insertion)
    mod = importlib.import_module("workbench.buffers.analyze")
    keep = {"stale-read", "uninitialized-read", "raw", "war", "waw", "use-after-free", "out-of-bounds"}
    rng = random.Random(seed)
    checked = 0
    for _ in range(300):
        doc = random_schedule(rng, "concurrent" if rng.random() < 0.5 else "serial")
        monkeypatch.setattr(mod, "_WIDE", 48)
        narrow = [h.to_dict() for h in analyze(doc)]
        monkeypatch.setattr(mod, "_WIDE", 0)
        wide = [h.to_dict() for h in analyze(doc)]
        assert sorted(map(json.dumps, wide)) == sorted(map(json.dumps, narrow)), json.dumps(doc)
        got = {(h["kind"], h["event"], h["other"], h["buffer"], tuple(h["range"]) if h["range"] else None)
               for h in wide if h["kind"] in keep}
        assert got == oracle(doc), json.dumps(doc)
        checked += len(got)
    assert checked > 50


def test_fifo_and_oversized_schedules_are_refused_before_reading(tmp_path, capsys):
    from workbench.buffers import schedule as sch_mod
    from workbench.cli import main
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert main(["hazards", str(fifo)]) == 2  # would block forever if opened for reading
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a regular file" in err and str(fifo) in err
    assert time.monotonic() - t0 < 5
    assert main(["hazards", "/dev/zero"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a regular file" in err
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(sch_mod.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    assert main(["hazards", str(big)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "over the 268.435 MB limit" in err and "big.json" in err
    with pytest.raises(ScheduleError, match="not a regular file"):
        load_schedule(fifo)


def test_max_per_kind_keeps_memory_bounded_and_counts_complete():
    from workbench.buffers import summarize
    doc = concurrent_same(50)
    full = analyze(doc)
    capped = analyze(doc, max_per_kind=3)
    assert summarize(capped) == summarize(full) and full.omitted == {}
    assert all(n <= 3 for n in _kinds([h.to_dict() for h in capped]).values())
    assert capped == [h for h in full if sum(g.kind == h.kind for g in full[: full.index(h) + 1]) <= 3]
