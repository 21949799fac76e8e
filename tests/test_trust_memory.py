"""Issue 33, items 3, 7 and 8 (load): a checkpoint over memory is refused before it is read
(exit 2, one line naming the bytes, the memory and a --memory-budget that works), no output
path replaces an existing file silently, and load()'s arguments are checked.

The preflight is tested on the demo with the memory figure lowered
(``WORKBENCH_MEMORY_AVAILABLE``), and once for real: a sparse checkpoint larger than this
machine's memory, in a child process (a regression fails the test, never kills pytest).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import workbench
from workbench.cli import main
from workbench.device_memory import MEMORY_ENV, NotEnoughMemory, available_memory
from workbench.sizes import parse_bytes, round_size

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo"
DEMO_BYTES = 2042824  # the demo's weights, bfloat16, held once each (tied head: read once)


def cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def memory(monkeypatch):
    """Set the memory figure the preflight sees: ``memory("1MB")``."""
    def set_to(size: str):
        monkeypatch.setenv(MEMORY_ENV, size)
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    return set_to


# ---------------------------------------------------------------------------- preflight

def test_hunt_refuses_weights_over_memory_and_names_a_budget_that_works(capsys, memory):
    memory("1MB")
    rc, out, err = cli(capsys, "hunt", DEMO, "--prompt", "hi")
    line = one_line(err)
    assert rc == 2 and out == ""
    assert f"need {DEMO_BYTES} bytes" in line and "976.56 KiB of memory available" in line, line
    assert MEMORY_ENV in line  # where the figure came from
    budget = re.search(r"--memory-budget (\S+)", line).group(1)
    assert parse_bytes(budget) <= 10**6  # within the memory there is
    rc, out, err = cli(capsys, "hunt", DEMO, "--prompt", "hi", "--memory-budget", budget)
    assert rc == 0 and out.startswith("clean:"), err


def test_dump_and_diff_refuse_before_writing(capsys, memory, tmp_path):
    memory("1MB")
    out_path = tmp_path / "ref.safetensors"
    rc, out, err = cli(capsys, "dump", DEMO, "--prompt", "hi", "--out", out_path)
    assert rc == 2 and f"need {DEMO_BYTES} bytes" in one_line(err)
    assert not out_path.exists() and os.listdir(tmp_path) == []  # no temporary left either
    memory("1TB")
    assert cli(capsys, "dump", DEMO, "--prompt", "hi", "--out", out_path)[0] == 0
    memory("1MB")
    rc, out, err = cli(capsys, "diff", DEMO, out_path, "--prompt", "hi")
    line = one_line(err)
    # refused in one line naming the memory: the model's preflight ("... memory available"), or first,
    # since issue 41 item 2, the dump reader's own budget (a share of the memory there is)
    assert rc == 2 and ("memory available" in line or f"{MEMORY_ENV} gives" in line), line


def test_distributed_checks_the_ranks_own_layers(capsys, memory):
    memory("1MB")
    rc, out, err = cli(capsys, "distributed", DEMO, "--prompt", "hi")
    line = one_line(err)
    assert rc == 2 and "rank 0 (layers 0-3): its weights need" in line and "more ranks" in line, line


def test_no_budget_helps_when_one_segment_is_over_memory(capsys, memory):
    memory("300kB")  # the largest layer reads 497.50 KiB
    rc, out, err = cli(capsys, "hunt", DEMO, "--prompt", "hi")
    line = one_line(err)
    assert rc == 2 and "streaming cannot help either" in line and "layers.3 alone reads" in line, line
    rc, out, err = cli(capsys, "hunt", DEMO, "--prompt", "hi", "--memory-budget", "40GB")
    line = one_line(err)
    assert rc == 2 and "streamed, layers.3 reads at once" in line and "no memory budget streams it" in line, line


def test_load_raises_not_enough_memory_a_memory_and_value_error(memory):
    memory("1MB")
    with pytest.raises(NotEnoughMemory) as e:
        workbench.load(str(DEMO))
    assert isinstance(e.value, MemoryError) and isinstance(e.value, ValueError)
    assert "\n" not in str(e.value) and "memory_budget=" in str(e.value)
    m = workbench.load(str(DEMO), memory_budget="750kB")
    assert m.memory_budget == 750_000
    memory("1TB")
    assert not hasattr(workbench.load(str(DEMO)), "memory_budget")  # fits: held, as before


def test_converted_copies_count(memory):
    from workbench.models.streaming import held_bytes

    m = workbench.load(str(DEMO))
    assert held_bytes(m) == DEMO_BYTES
    assert held_bytes(m, dtype="float32") == 3 * DEMO_BYTES  # bfloat16 as stored + its float32 copy
    memory(str(2 * DEMO_BYTES))  # the stored weights fit, with their float32 copies they do not
    workbench.load(str(DEMO))
    with pytest.raises(NotEnoughMemory, match=r"\(float32\) need 6128472 bytes"):
        workbench.load(str(DEMO), dtype="float32")


def test_a_bad_memory_figure_is_one_line(capsys, memory):
    memory("lots")
    rc, out, err = cli(capsys, "hunt", DEMO, "--prompt", "hi")
    assert rc == 2 and MEMORY_ENV in one_line(err)


def test_available_memory_is_known_here(memory):
    n, source = available_memory()
    assert sys.platform != "linux" or (n is not None and n > 0 and source != "unknown")
    memory("5GiB")
    assert available_memory() == (5 * 2**30, MEMORY_ENV)


def _sparse_checkpoint(dst: Path, rows: int) -> int:
    """The demo with ``embed_tokens`` [rows, 128] bfloat16, its data a hole (no disk used);
    returns the file's size."""
    dst.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / f, dst)
    cfg = json.loads((DEMO / "config.json").read_text())
    cfg["vocab_size"] = rows
    (dst / "config.json").write_text(json.dumps(cfg))
    raw = (DEMO / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    big = "model.embed_tokens.weight"
    out, chunks, off = {"__metadata__": hdr.pop("__metadata__")}, [], 0
    for k, v in hdr.items():
        if k != big:
            s, e = v["data_offsets"]
            chunks.append(data[s:e])
            out[k] = dict(v, data_offsets=[off, off + e - s])
            off += e - s
    nbytes = rows * 128 * 2
    out[big] = dict(hdr[big], shape=[rows, 128], data_offsets=[off, off + nbytes])
    hb = json.dumps(out).encode()
    hb += b" " * (-len(hb) % 8)
    path = dst / "model.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for c in chunks:
            f.write(c)
        f.truncate(f.tell() + nbytes)
    return path.stat().st_size


@pytest.mark.parametrize("cmd", [["hunt"], ["dump", "--out", "{tmp}/ref.safetensors"]])
def test_a_sparse_checkpoint_over_memory_is_refused_not_a_crash(tmp_path, cmd):
    avail, _ = available_memory()
    if avail is None:
        pytest.skip("no memory figure on this machine")
    rows = max(120_000_000, int(avail * 1.3) // 256)  # the 30.7 GB, or 1.3x the memory there is
    ck = tmp_path / "big"
    size = _sparse_checkpoint(ck, rows)
    if os.stat(ck / "model.safetensors").st_blocks * 512 > 64 << 20:  # no holes here: do not fill the disk
        shutil.rmtree(ck)
        pytest.skip("this filesystem makes no sparse files")
    assert size > avail
    args = [a.replace("{tmp}", str(tmp_path)) for a in cmd]
    env = {k: v for k, v in os.environ.items() if k not in (MEMORY_ENV, "PYTHONWARNINGS")}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "workbench.cli", args[0], str(ck), "--prompt", "hi", *args[1:]],
                       capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])  # (SIGSEGV was -11)
    line = one_line(p.stderr)
    assert re.search(r"the weights \(bfloat16\) need \d+ bytes \([\d.]+ GiB\), over the [\d.]+ GiB of memory "
                     r"available", line), line
    assert "streaming cannot help either: norm..logits alone reads" in line, line  # the tied head reads it whole
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "ref.safetensors").exists()


# ---------------------------------------------------------------------------- no silent overwrite

@pytest.fixture(scope="module")
def ref_dump(tmp_path_factory):
    out = tmp_path_factory.mktemp("dump") / "ref.safetensors"
    assert main(["dump", str(DEMO), "--ids", "2,15,16", "--out", str(out)]) == 0
    return out


def test_dump_replaces_only_its_own_dump(capsys, tmp_path, ref_dump):
    mine = tmp_path / "mine.safetensors"
    mine.write_bytes(b"my data")
    rc, out, err = cli(capsys, "dump", DEMO, "--ids", "2,15", "--out", mine)
    assert rc == 2 and "exists and is not a workbench dump: not overwriting it" in one_line(err)
    assert mine.read_bytes() == b"my data"
    again = tmp_path / "again.safetensors"
    shutil.copy(ref_dump, again)
    assert cli(capsys, "dump", DEMO, "--ids", "2,15", "--out", again)[0] == 0
    assert again.read_bytes() != ref_dump.read_bytes()  # (two ids now: replaced)


@pytest.mark.parametrize("flag", ["--plot", "--plot-positions"])
def test_diff_plots_never_replace_a_file(capsys, tmp_path, ref_dump, flag):
    dest = tmp_path / "err.png"
    dest.write_bytes(b"not yours")
    rc, out, err = cli(capsys, "diff", DEMO, ref_dump, "--ids", "2,15,16", flag, dest)
    assert rc == 2 and out == ""
    assert one_line(err) == f"workbench diff: {dest} exists: not overwriting it (remove it first or choose another name)"
    assert dest.read_bytes() == b"not yours"
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    link = tmp_path / "link.png"
    link.symlink_to(target)
    rc, out, err = cli(capsys, "diff", DEMO, ref_dump, "--ids", "2,15,16", flag, link)
    assert rc == 2 and "symbolic link" in one_line(err) and target.read_bytes() == b"keep"
    new = tmp_path / "new.png"
    rc, out, err = cli(capsys, "diff", DEMO, ref_dump, "--ids", "2,15,16", flag, new)
    assert rc == 0 and new.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diff_two_plots_to_one_file(capsys, tmp_path, ref_dump):
    rc, out, err = cli(capsys, "diff", DEMO, ref_dump, "--ids", "2,15,16", "--plot", tmp_path / "a.png",
                       "--plot-positions", f"{tmp_path}/./a.png")
    assert rc == 2 and "name the same file" in one_line(err) and not (tmp_path / "a.png").exists()


def test_distributed_logits_never_replace_a_file(capsys, tmp_path):
    dest = tmp_path / "logits.npy"
    dest.write_bytes(b"precious")
    rc, out, err = cli(capsys, "distributed", DEMO, "--ids", "2,15,16", "--logits", dest)
    assert rc == 2 and f"{dest} exists: not overwriting it" in one_line(err)
    assert dest.read_bytes() == b"precious"
    new = tmp_path / "new.npy"
    assert cli(capsys, "distributed", DEMO, "--ids", "2,15,16", "--logits", new)[0] == 0
    import numpy as np

    assert np.load(new).shape == (1, 3, 522)   # [batch, position, vocab], as tr.logits


# ---------------------------------------------------------------------------- load() arguments

@pytest.mark.parametrize("path, exc, needle", [
    (None, TypeError, "not NoneType"), (3, TypeError, "not int"), ("", ValueError, "path is empty"),
    (b"assets/demo", TypeError, "not bytes")])
def test_load_path_is_checked(path, exc, needle):
    with pytest.raises(exc, match=needle):
        workbench.load(path)


@pytest.mark.parametrize("kw, exc, needle", [
    ({"library": "os"}, ValueError, "library must be None, 'mlx_lm' or 'mlx_vlm', not 'os'"),
    ({"library": 1}, ValueError, "library must be"),
    ({"granularity": "layer"}, ValueError, "granularity must be one of"),
    ({"dtype": "int8"}, ValueError, "unknown dtype"),
    ({"memory_budget": "-5GB"}, ValueError, "memory_budget must be positive, not '-5GB'"),
    ({"memory_budget": 0}, ValueError, "memory_budget must be positive"),
    ({"memroy_budget": "1GB"}, TypeError, "memroy_budget"),
])
def test_load_arguments_are_checked(kw, exc, needle):
    with pytest.raises(exc, match=re.escape(needle)):
        workbench.load(str(DEMO), **kw)


@pytest.mark.parametrize("value", ["-5GB", "-5", "-1.5GiB", "0", "0GB"])
def test_memory_budget_negative_or_zero_on_the_command_line(capsys, value):
    rc, out, err = cli(capsys, "hunt", DEMO, "--prompt", "hi", "--memory-budget", value)
    assert rc == 2
    assert one_line(err) == f"workbench hunt: --memory-budget must be positive, not {value!r}"


@pytest.mark.parametrize("n", [1, 999, 10**6, 1_050_000_000, 16_700_000_000, 123_456_789_012])
def test_round_size_rounds_as_it_says(n):
    down, up = parse_bytes(round_size(n)), parse_bytes(round_size(n, up=True))
    assert down <= n <= up
    assert up <= n * 1.11 + 1 and down >= n * 0.9 - 1
