"""Every engine-dump reader bounded in time and memory (issue 41, item 2).

The three findings of the review against the llama.cpp text reader, each through the command
line (``workbench diff assets/demo DUMP``, with ``--engine llama.cpp`` and auto-detected): a
header line that made the old regex backtrack quadratically (380 KB: 38 s), a 100-byte dump
whose shape allocated 10 GiB, and a shape whose element count overflowed int64.  Each must end
in exit 2 with one line naming the file, the line and the tensor, in bounded CPU time and peak
memory (the child's own: tests/test_hostile.py's ``run_cli``).  Then the header parser against
the old regex (same results on every line the regex reads in reasonable time), a fuzz of the
text reader (returns or DumpError, within 1 s per MB), and the same class of problem in the
other readers (.npy directories, .npz archives, safetensors) and the diff's glue.
"""
from __future__ import annotations

import io
import os
import random
import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from test_hostile import check, header, run_cli, write_st
from workbench.diff.ggml_text import MAX_LINE, is_eval_callback_text, parse_header, read_eval_callback
from workbench.diff.readers import DumpError, read_dump, read_npz

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo"
DATA = REPO / "tests" / "data" / "engines"
MB = 1 << 20

#: one valid tensor (the 7 lines before each repro's line 8)
VALID = """ggml_debug:                 inp_embd = (f32)   GET_ROWS(token_embd.weight{64, 256, 1, 1}, leaf_2{3, 1, 1, 1}}) = {2, 1, 1, 1}
                                     [
                                      [
                                       [      0.2225,       0.0243],
                                      ],
                                     ]
                                     sum = 0.2468
"""
#: a 100-byte tensor whose shape is the point
BIG = """ggml_debug: big = (f32) ADD(a{1, 1, 1, 1}, b{1, 1, 1, 1}}) = {SHAPE}
 [
  [
   [ 1.0000, ...],
  ],
 ]
"""
#: the bounds of one CLI run that fails on reading the dump (the interpreter alone is ~60 MB;
#: the old reader spent 38 s on the 380 KB line and 8 GB on the 10 GiB shape)
CPU_S = 10.0
PEAK_MB = 400


def diff_both_ways(dump: Path, *needles: str, env=None, peak_mb: float = PEAK_MB):
    """``workbench diff assets/demo DUMP`` with ``--engine llama.cpp`` and auto-detected: exit 2,
    one line naming ``needles``, within CPU_S and ``peak_mb``."""
    for extra in (["--engine", "llama.cpp"], []):
        r = run_cli("diff", DEMO, dump, *extra, "--ids", "1,2,3", env=env, wall=120)
        check(r, 2, str(dump), *needles, cpu=CPU_S, peak_mb=peak_mb)


# ------------------------------------------------------------------ the three findings

def test_quadratic_header_line_is_refused_in_bounded_time(tmp_path):
    """Finding 1: one valid tensor, then a 380 KB line of header fragments (the old regex: 38 s
    a run, ~17 min at 2 MB).  Over MAX_LINE and starting like a header: refused by its line."""
    for reps in (20000, 105000):  # 380 KB, 2 MB
        dump = tmp_path / f"quad{reps}.txt"
        dump.write_text(VALID + "ggml_debug: n" + (" = (f32) M(" + ") = {1,2") * reps + "\n")
        diff_both_ways(dump, "line 8", "tensor 'n'", f"header over {MAX_LINE} bytes")


def test_quadratic_header_under_the_cap_is_read_in_linear_time(tmp_path):
    """The same fragments in lines just under MAX_LINE, 64 of them (1 MB), after the valid
    tensor: read as log lines in linear time (the old regex: ~0.07 s a line, 4 s); the same
    line closed into a header (the regex matched it too) is parsed."""
    unit = " = (f32) M(" + ") = {1,2"
    line = "ggml_debug: n" + unit * ((MAX_LINE - 40) // len(unit))
    assert len(line) <= MAX_LINE
    dump = tmp_path / "long_lines.txt"
    dump.write_text(VALID + (line + "\n") * 64)
    t = time.process_time()
    arrays, _, _ = read_eval_callback(dump, budget=64 * MB)
    assert time.process_time() - t < 1.0 and list(arrays) == ["inp_embd"]
    closed = line + ") = {2, 1, 1, 1}"
    assert parse_header(closed)[::4] == ("n", "2, 1, 1, 1")
    diff_both_ways(dump)  # (read whole; then the demo, a Gemma 4, is no match for a 2-value llama dump)


def test_shape_of_10_gib_is_refused_before_allocating(tmp_path):
    """Finding 2: {1073741824, 2, 1, 1} with one printed value (the old reader built 8 GiB of
    float32 and a 2 GiB mask).  Past the read budget (here a quarter of 8 GB): refused, by line,
    before any allocation, the budget and its source named."""
    dump = tmp_path / "alloc.txt"
    dump.write_text(VALID + BIG.replace("SHAPE", "1073741824, 2, 1, 1"))
    diff_both_ways(dump, "line 8", "tensor 'big'", "{1073741824, 2, 1, 1}", "10737420288 bytes",
                   "budget", "1.86 GiB", "WORKBENCH_MEMORY_AVAILABLE", env={"WORKBENCH_MEMORY_AVAILABLE": "8GB"})
    with pytest.raises(DumpError, match=r"line 8: tensor 'big' .* over the 1.00 MiB budget .*the budget given"):
        read_eval_callback(dump, budget=MB)


def test_shape_past_any_memory_is_refused_with_the_machines_budget(tmp_path):
    """{1073741824, 1024, 1, 1}: 5 TiB, past a quarter of any machine's memory; the budget's source
    is the memory available (MemAvailable here), said in the line."""
    dump = tmp_path / "alloc5t.txt"
    dump.write_text(VALID + BIG.replace("SHAPE", "1073741824, 1024, 1, 1"))
    diff_both_ways(dump, "line 8", "tensor 'big'", "{1073741824, 1024, 1, 1}", "budget", "of memory available")


def test_shape_overflowing_int64_is_one_line(tmp_path):
    """Finding 3: {4611686018427387904, 4, 1, 1} multiplies to 0 in int64 (the old check let it
    through and numpy said only "array is too big"); exact integers refuse it by line."""
    dump = tmp_path / "overflow.txt"
    dump.write_text(VALID + BIG.replace("SHAPE", "4611686018427387904, 4, 1, 1"))
    diff_both_ways(dump, "line 8", "tensor 'big'", "{4611686018427387904, 4, 1, 1}", "92233720368547760128",
                   "budget")


def test_budget_is_charged_per_file_and_only_for_printed_tensors(tmp_path):
    """The budget covers the dump, not one tensor: the second of two 4 MiB tensors is refused
    past 6 MiB (the first one's bytes named); a tensor that prints no values (quantized) costs
    nothing, whatever its shape."""
    t = "ggml_debug: {name} = (f32) ADD(a{{1, 1, 1, 1}}, b{{1, 1, 1, 1}}}}) = {{1048576, 1, 1, 1}}\n [\n  [\n   [ 1.0, ...],\n  ],\n ]\n"
    q = "ggml_debug: q = (q8_0) VIEW(a{1, 1, 1, 1}, }) = {1073741824, 1024, 1, 1}\n"
    dump = tmp_path / "two.txt"
    dump.write_text(q + t.format(name="a-0") + q + t.format(name="b-0"))
    arrays, _, _ = read_eval_callback(dump, budget=16 * MB)
    assert set(arrays) == {"a-0", "b-0"}
    with pytest.raises(DumpError, match=r"two.txt: line 9: tensor 'b-0' of shape \{1048576, 1, 1, 1\} needs "
                                        r"5244928 bytes .* with the 5.00 MiB of the tensors before it, over the 6.00 MiB"):
        read_eval_callback(dump, budget=6 * MB)


def test_long_lines_skipped_or_refused(tmp_path):
    """A log line over MAX_LINE (a long prompt) is skipped in pieces, the dump read as without
    it; a value row over MAX_LINE is refused by line and tensor."""
    clean = (DATA / "llama_clean.ggml.txt").read_text()
    dump = tmp_path / "prompt.txt"
    dump.write_text("prompt: " + "abc " * 500_000 + "\n" + clean)
    a, _, k = read_eval_callback(dump, budget=64 * MB)
    b, _, _ = read_eval_callback(DATA / "llama_clean.ggml.txt", budget=64 * MB)
    assert list(a) == list(b) and all(np.array_equal(a[n], b[n], equal_nan=True) for n in a)
    lines = clean.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip().startswith("[ ") and "," in line)
    lines[i] = lines[i].replace(",", ", " + "0.0, " * 5000, 1)
    row = tmp_path / "row.txt"
    row.write_text("\n".join(lines) + "\n")
    with pytest.raises(DumpError, match=rf"row.txt: line {i + 1} \(tensor '.+'\): a value row over {MAX_LINE} bytes"):
        read_eval_callback(row, budget=64 * MB)


# ------------------------------------------------------------------ the header parser against the old regex

#: the regex the header was read with before (quadratic backtracking); the oracle below
OLD_HEADER = re.compile(r"^\s*(\w+):\s+(.+?) = \((\w+)\)\s+(\S+?)\((.*)\) = \{([-\d, ]+)\}\s*$")


def old_parse(line: str):
    m = OLD_HEADER.match(line)
    return None if m is None else m.group(2, 3, 4, 5, 6)


def test_parser_matches_the_old_regex_on_every_real_line():
    n = 0
    for f in sorted(DATA.glob("*.txt")):
        for line in f.read_text().splitlines():
            assert parse_header(line) == old_parse(line), (f.name, line)
            n += 1
    assert n > 8000


def test_parser_matches_the_old_regex_on_random_lines():
    """Short random and mutated lines (the regex is fast on them): same groups or both none,
    across Unicode blanks and digits, empty names (GGML prints 24 spaces), views' spaces."""
    rng = random.Random(41)
    frags = [" = (", ") = {", "(", ")", "{", "}", " ", "  ", "\t", "f32", "MUL", "ggml_debug:", ":", "=", ",", "1",
             "-", "0, 1", "x", "_", "\u00a0", "\u0663", "\x1f", "\x00", "\ufffd", "é", " (reshaped)", "\u3000", "}}"]
    bases = ["ggml_debug:                   Qcur-0 = (f32)    MUL_MAT(blk.0.attn_q.weight{64, 64, 1, 1}, "
             "attn_norm-0{64, 7, 1, 1}}) = {64, 7, 1, 1}",
             "ggml_debug:               (permuted) = (f32)    PERMUTE(node_24{16, 7, 4, 1}, }) = {16, 4, 7, 1}",
             "ggml_debug:                          = (f32)  ADD(a{1, 1, 1, 1}, }) = {1, 1, 1, 1}",
             "  x:   = (f32) A(b) = {1}", "w: \t = (f) o() = {}"]
    found = 0
    for _ in range(60_000):
        if rng.random() < 0.5:
            line = "".join(rng.choice(frags) for _ in range(rng.randint(0, 25)))
        else:
            chars = list(rng.choice(bases))
            for _ in range(rng.randint(1, 4)):
                pos, op = rng.randint(0, len(chars)), rng.random()
                if op < 0.4:
                    chars[pos:pos] = rng.choice(frags)
                elif op < 0.8:
                    del chars[pos:pos + rng.randint(1, 5)]
                else:
                    chars[pos:pos + 1] = rng.choice(frags)
            line = "".join(chars)
        want = old_parse(line)
        assert parse_header(line) == want, repr(line)
        found += want is not None
    assert found > 5000  # (the headers, mutated, still read: the comparison is not all "none")


# ------------------------------------------------------------------ fuzz

FRAGMENTS = [" = (f32) M(", ") = {1,2", " = (", ") = {", "(", "{", " = (w) ", "}", "[", "]", "..., ", "\t"]


def _noise(rng: random.Random) -> bytes:
    """One adversarial line the reader must take without error (skip, or read as a header that
    prints no values): long lines of header fragments under and over MAX_LINE, headers of
    huge or int64-overflowing shapes, deep brackets, NUL bytes, invalid UTF-8, odd breaks."""
    r = rng.random()
    frags = lambda n: "".join(rng.choice(FRAGMENTS) for _ in range(n))  # noqa: E731
    if r < 0.25:  # under the cap: a log line, or a header with no values (many " = (" to pass)
        return ("ggml_debug: n" + frags(rng.randint(100, 1500)) + rng.choice(["", ") = {1, 1, 1, 1}", ") = {2,"])).encode()
    if r < 0.4:  # over the cap, not starting like a header: skipped in pieces
        return ("prompt: " + "a b " * 70 + frags(rng.randint(2000, 12000))).encode()  # (a name: <= 256)
    if r < 0.55:  # a header whose shape is past any budget, printing no values (quantized)
        shape = rng.choice(["1073741824, 2, 1, 1", "4611686018427387904, 4, 1, 1", "9" * 300 + ", 1, 1, 1"])
        return f"ggml_debug: q-{rng.randint(0, 3)} = (q8_0) VIEW(w{{1, 1, 1, 1}}, }}) = {{{shape}}}".encode()
    if r < 0.7:  # brackets that are no value row
        return rng.choice(["[", "]"]).encode() * rng.randint(2, 5000)
    return b"x" + bytes(rng.choice([0, 0xFF, 0xFE, 0xC3, 0x80, 0x0D, 0x0B, 0x1C, 0x85, 0x20, 0x2C, 0x31, 0x5B, 0x5D])
                        for _ in range(rng.randint(0, 2000)))


def _random_line(rng: random.Random, real: list[str]) -> bytes:
    """Any line: real ones cut anywhere, headers of odd shapes (negative, 2 sizes, Unicode digits),
    value rows with garbage numbers, or noise: most files end at their first bad line."""
    r = rng.random()
    if r < 0.4:
        line = rng.choice(real)
        return (line[:rng.randint(0, len(line))] if rng.random() < 0.3 else line).encode()
    if r < 0.55:
        shape = rng.choice(["-1, 2, 3, 4", "1, 2", "\u0663, 1, 1, 1", "0, 1, 1, 1", "2, 2, 2, 2", "", ", , , ,",
                            "1" * 5000 + ", 1, 1, 1", "64, 7, 1, 1", "1073741824, 2, 1, 1"])
        return f"ggml_debug: t-{rng.randint(0, 3)} = (f32) ADD(a{{1, 1, 1, 1}}, }}) = {{{shape}}}".encode()
    if r < 0.7:
        vals = [rng.choice(["1.0", "-0.5", "nan", "inf", "1e999", "...", "0x10", "1_0", "abc", "", "\x00", "--1"])
                for _ in range(rng.randint(0, 12))]
        return rng.choice(["[", "],", "]", "...,", "sum = 1", "[ " + ", ".join(vals) + "],"]).encode()
    if r < 0.75:
        return (rng.choice(["ggml_debug: n", "  [ "]) + "".join(rng.choice(FRAGMENTS) for _ in range(3000))).encode()
    return _noise(rng)


def _write(path: Path, lines, size: int) -> int:
    with open(path, "wb") as f:
        n = 0
        while n < size:
            chunk = next(lines) + b"\n"
            f.write(chunk)
            n += len(chunk)
    return n


def _timed(path: Path):
    """(CPU seconds, the reader's arrays or its DumpError) for is_eval_callback_text + the reader."""
    t = time.process_time()
    assert is_eval_callback_text(path) in (True, False)
    try:
        out = read_eval_callback(path, budget=64 * MB)[0]
    except DumpError as e:
        assert "\n" not in str(e) and len(str(e)) < 2000, str(e)[:500]
        out = e
    return time.process_time() - t, out


def test_fuzz_readable_hostile_text_in_linear_time(tmp_path):
    """5 MB of llama.cpp's real tensors among adversarial lines the reader must get through (seed
    fixed): every file read whole, every tensor kept, at most 1 s of CPU per MB (the old regex:
    minutes a MB)."""
    rng = random.Random(41_2)
    text = (DATA / "llama_clean.real.ggml.txt").read_text()
    blocks = [b.encode() for b in re.split(r"\n(?=ggml_debug:)", text)[1:]]

    def lines():
        while True:
            yield rng.choice(blocks) if rng.random() < 0.5 else _noise(rng)

    total_mb = total_s = 0.0
    for k in range(5):
        path = tmp_path / f"readable{k}.txt"
        mb = _write(path, lines(), MB) / MB
        spent, arrays = _timed(path)
        assert isinstance(arrays, dict) and len(arrays) > 50, arrays
        assert spent < 1.0 * mb, (path.name, spent, mb)
        total_mb, total_s = total_mb + mb, total_s + spent
    assert total_mb >= 5 and total_s < total_mb


def test_fuzz_random_text_returns_or_refuses(tmp_path):
    """Random lines (cut real ones, odd shapes, garbage numbers, noise), 200 files of ~25 KB
    (seed fixed): each returns or raises DumpError (one line), at most 1 s of CPU per MB."""
    rng = random.Random(41_3)
    real = (DATA / "llama_clean.real.ggml.txt").read_text().splitlines()

    def lines():
        while True:
            yield _random_line(rng, real)

    outcomes = {"read": 0, "refused": 0}
    total_mb = total_s = 0.0
    for k in range(200):
        path = tmp_path / f"random{k}.txt"
        mb = _write(path, lines(), 25_000) / MB
        spent, out = _timed(path)
        outcomes["refused" if isinstance(out, DumpError) else "read"] += 1
        assert spent < 1.0 * mb + 0.05, (path.name, spent, mb)
        total_mb, total_s = total_mb + mb, total_s + spent
    assert total_mb >= 4.5 and total_s < total_mb and outcomes["refused"] > 20, (total_mb, total_s, outcomes)


# ------------------------------------------------------------------ the other readers

def _npy_header(shape, descr="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def test_npy_claiming_4_tib_is_refused_by_file(tmp_path):
    """A 144-byte .npy whose header claims 2^40 float32: refused naming the file before numpy
    allocates the claim (it raised a MemoryError naming nothing)."""
    d = tmp_path / "npy"
    (d / "layers.0").mkdir(parents=True)
    (d / "layers.0" / "big.npy").write_bytes(_npy_header((1 << 20, 1 << 20)) + b"\0" * 16)
    r = run_cli("diff", DEMO, d, "--ids", "1,2,3")
    check(r, 2, "big.npy", "claims shape [1048576, 1048576]", "holds 16 bytes", cpu=CPU_S, peak_mb=PEAK_MB)


def test_deflated_npz_past_the_budget_is_refused(tmp_path):
    """An .npz of 64 KB whose member unpacks to 64 MiB of uint8 (256 MiB as float32): within its
    archive's word, so the read budget (here 50 MB) refuses it, before unpacking."""
    path = tmp_path / "e.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z, z.open("layers.0.npy", "w") as m:
        m.write(_npy_header((64 * MB,), "|u1"))
        zeros = b"\0" * MB
        for _ in range(64):
            m.write(zeros)
    assert path.stat().st_size < MB
    r = run_cli("diff", DEMO, path, "--ids", "1,2,3", env={"WORKBENCH_MEMORY_AVAILABLE": "100MB"})
    check(r, 2, "e.npz", "'layers.0'", "[67108864]", "budget", "WORKBENCH_MEMORY_AVAILABLE", cpu=CPU_S, peak_mb=250)


def test_safetensors_past_the_budget_is_refused(tmp_path):
    """A U8 tensor of 64 MiB (a sparse file) is 256 MiB as float32: refused by name and offset."""
    path = tmp_path / "e.safetensors"
    hdr = {"layers.0": {"dtype": "U8", "shape": [64 * MB], "data_offsets": [0, 64 * MB]}}
    write_st(path, hdr, b"")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + 64 * MB)
    r = run_cli("diff", DEMO, path, "--ids", "1,2,3", env={"WORKBENCH_MEMORY_AVAILABLE": "100MB"})
    check(r, 2, "e.safetensors", "'layers.0' at byte", "[67108864]", "budget", cpu=CPU_S, peak_mb=250)
    with pytest.raises(DumpError, match="over the 1.00 MiB budget"):
        read_dump(path, budget=MB)


def test_npz_of_many_members_reads_in_linear_time(tmp_path):
    """Each member was looked up in the archive's list of names (quadratic: 40,000 members, 9 MB,
    took 69 s); 4x the members must take well under 16x the time."""
    buf = io.BytesIO()
    np.save(buf, np.zeros(1, np.float32))
    member = buf.getvalue()
    spent = {}
    for n in (3000, 12000):
        path = tmp_path / f"many{n}.npz"
        with zipfile.ZipFile(path, "w") as z:
            for i in range(n):
                z.writestr(f"t{i}.npy", member)
        t = time.process_time()
        assert len(read_npz(path, budget=256 * MB)) == n
        spent[n] = time.process_time() - t
    assert spent[12000] < 8 * spent[3000] + 0.5, spent


def test_npz_holding_a_single_npy_is_named_not_read(tmp_path):
    path = tmp_path / "one.npz"
    path.write_bytes(_npy_header((1 << 40,)) + b"\0" * 16)
    with pytest.raises(DumpError, match="one.npz: not an .npz archive .*single array"):
        read_npz(path)


def test_reference_naming_a_fifo_config_does_not_hang(tmp_path):
    """A reference dump names its model's path (workbench.model); the llama.cpp adapter reads
    that directory's config.json for the family and head size.  A FIFO there is refused (read
    through fsio), never opened: the old read_text waited for a writer forever."""
    ref = tmp_path / "ref.safetensors"
    check(run_cli("dump", DEMO, "--ids", "1,2,3", "--out", ref), 0)
    hdr, data = header(ref)
    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "config.json")
    hdr["__metadata__"]["workbench.model"] = str(tmp_path / "m")
    forged = tmp_path / "forged.safetensors"
    write_st(forged, hdr, data)
    r = run_cli("diff", forged, DATA / "llama_clean.ggml.txt", "--engine", "llama.cpp", wall=60)
    assert r.rc in (0, 1, 2) and "Traceback" not in r.err, r
