"""Hostile input and local attackers (issue 13).

A corpus of hostile inputs, generated here, each run through the command line as a
subprocess: the expected exit status, a one-line stderr (no traceback, no Python
warning), and bounds on CPU time and peak memory measured for that child
(``os.wait4``).  Then the three security properties: the lab's token is on no process's
command line, a link planted at a temporary or final name is left untouched, and a
foreign-owned, group-writable or tampered native cache is refused.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from workbench import fsio

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo"
MB = 1 << 20

#: bounds for one CLI run (the interpreter with mlx / numpy imported is ~200-400 MB)
CPU_S = 60.0
PEAK_MB = 1500
WALL_S = 300.0  # a hang ends the run here (and fails the test), never the suite


class Run:
    def __init__(self, rc, out, err, cpu, peak_mb, wall):
        self.rc, self.out, self.err, self.cpu, self.peak_mb, self.wall = rc, out, err, cpu, peak_mb, wall

    def __repr__(self):
        return f"<rc={self.rc} cpu={self.cpu:.1f}s peak={self.peak_mb:.0f}MB err={self.err[:300]!r}>"


#: the child: ``python -c _CHILD HWM_FILE DENY ARGS...`` runs ``workbench ARGS`` and, at exit,
#: writes its peak RSS (VmHWM, KiB) into HWM_FILE.  VmHWM belongs to the child's own address
#: space (made fresh by exec), while wait4's ru_maxrss carries the parent's peak across fork
#: and exec: a pytest process grown by earlier tests made every child look as large as it.
#: DENY (root only, "" for none): os.open refuses files with this name as the kernel would
#: refuse a mode-000 file to anyone else (root reads every file, and this venv's interpreter
#: lives under /root, so the CLI cannot be run as another user here).
_CHILD = """
import atexit, errno, os, sys
_hwm_file, _deny = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
def _report():
    try:
        with open("/proc/self/status") as f:
            kb = next((line.split()[1] for line in f if line.startswith("VmHWM:")), None)
        if kb is not None:
            with open(_hwm_file, "w") as f:
                f.write(kb)
    except OSError:
        pass
atexit.register(_report)
if _deny:
    _open = os.open
    def _guard(path, *a, **k):
        if os.path.basename(os.fspath(path)) == _deny:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return _open(path, *a, **k)
    os.open = _guard
"""
_CLI_CHILD = _CHILD + "from workbench.cli import main\nsys.exit(main(sys.argv[1:]))\n"
#: the same child running a snippet of Python (``sys.argv[1]``) instead of the CLI
_CODE_CHILD = _CHILD + "exec(compile(sys.argv[1], '<repro>', 'exec'), {'__name__': '__repro__'})\n"


def run_cli(*args, cwd=None, env=None, deny=None, wall=WALL_S, safe_path=False) -> Run:
    """``workbench ARGS`` in a child process; its own CPU time (wait4) and peak RSS (its
    VmHWM at exit; wait4's figure where the child could not report, e.g. killed).
    ``safe_path``: the working directory kept off the child's path, as the ``workbench``
    console script keeps it (``python -c`` puts it first)."""
    return _run_child(_CLI_CHILD, [str(a) for a in args], cwd, env, deny, wall, f"workbench {' '.join(map(str, args))}",
                      safe_path)


def run_code(code: str, *, cwd=None, env=None, wall=WALL_S) -> Run:
    """Python ``code`` in a child process (a library call a regression could crash), measured
    as :func:`run_cli` measures the CLI."""
    return _run_child(_CODE_CHILD, [code], cwd, env, None, wall, f"python code {code[:200]!r}")


def _run_child(child: str, args: list, cwd, env, deny, wall, label: str, safe_path: bool = False) -> Run:
    env = {**os.environ, **(env or {})}
    env.pop("PYTHONWARNINGS", None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryDirectory() as tmp:
        hwm = os.path.join(tmp, "hwm")
        t0 = time.monotonic()
        flags = (["-P"] if sys.version_info >= (3, 11) else ["-I"]) if safe_path else []
        p = subprocess.Popen([sys.executable, *flags, "-c", child, hwm, deny or "", *args], stdout=out,
                             stderr=err, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
        hung = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > wall:
                hung = True
                os.kill(p.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)  # (reaped here, not by Popen)
        out.seek(0)
        err.seek(0)
        peak_kb = ru.ru_maxrss
        if os.path.exists(hwm):
            with open(hwm) as f:
                peak_kb = int(f.read())
        r = Run(p.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                ru.ru_utime + ru.ru_stime, peak_kb / 1024, time.monotonic() - t0)
    assert not hung, f"{label} still running after {wall} s: {r}"
    return r


def check(r: Run, rc: int, *needles: str, cpu: float = CPU_S, peak_mb: float = PEAK_MB):
    assert r.rc == rc, r
    if rc == 2:
        lines = r.err.strip().splitlines()
        assert len(lines) == 1, r  # one line: no traceback, no warning
        for n in needles:
            assert n in lines[0], (n, r)
    else:
        assert r.err.strip() == "", r
    assert "Traceback" not in r.err and "Warning" not in r.err, r
    assert r.cpu < cpu, r
    assert r.peak_mb < peak_mb, r


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    ck = d / "ck"
    shutil.copytree(DEMO, ck)
    return d, ck


def copy(base, name):
    d, ck = base
    out = d / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(ck, out)
    return out


def header(path: Path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path: Path, hdr: dict, data: bytes):
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


# ------------------------------------------------------------------ special files, size caps

@pytest.mark.parametrize("which,kind", [("config.json", "FIFO"), ("model.safetensors", "FIFO"),
                                         ("config.json", "character device"), ("model.safetensors", "character device")])
def test_special_files_are_refused_by_name(base, which, kind):
    ck = copy(base, f"special-{which}-{kind[:4]}")
    target = ck / which
    target.unlink()
    if kind == "FIFO":
        os.mkfifo(target)  # opening it for reading would wait for a writer forever
    else:
        target.symlink_to("/dev/zero")  # read whole, it never ends
    r = run_cli("inspect", ck)
    check(r, 2, which, kind, "not a regular file")


@pytest.mark.parametrize("kind", ["FIFO", "huge"])
def test_special_or_huge_tokenizer_is_named(base, kind):
    ck = copy(base, f"tokenizer-{kind}")
    (ck / "tokenizer.json").unlink()
    if kind == "FIFO":
        os.mkfifo(ck / "tokenizer.json")
    else:
        with open(ck / "tokenizer.json", "wb") as f:
            f.truncate(3 << 30)  # sparse; the tokenizer library would read it whole
    r = run_cli("hunt", ck, "--prompt", "a b")
    check(r, 2, "tokenizer.json", "FIFO" if kind == "FIFO" else "limit", "--ids", peak_mb=800)


def test_fifo_or_device_index_is_reported_not_read(base):
    ck = copy(base, "fifo-index")
    os.mkfifo(ck / "model.safetensors.index.json")
    r = run_cli("inspect", ck, "--json")
    check(r, 1)
    msgs = [p["message"] for p in json.loads(r.out)["problems"]]
    assert any("model.safetensors.index.json is a FIFO" in m for m in msgs), msgs
    (ck / "model.safetensors.index.json").unlink()
    (ck / "model.safetensors.index.json").symlink_to("/dev/zero")
    r = run_cli("inspect", ck, "--json")
    check(r, 1)
    assert any("character device" in p["message"] for p in json.loads(r.out)["problems"])


def test_huge_config_is_refused_before_reading(base):
    ck = copy(base, "huge-config")
    with open(ck / "config.json", "r+b") as f:
        f.truncate(fsio.MAX_CONFIG + 1)  # sparse: costs no disk
    r = run_cli("inspect", ck)
    check(r, 2, "config.json", "limit", peak_mb=600)


def test_huge_index_is_refused_before_reading(base):
    ck = copy(base, "huge-index")
    with open(ck / "model.safetensors.index.json", "wb") as f:
        f.truncate(fsio.MAX_INDEX + 1)
    r = run_cli("inspect", ck, "--json")
    check(r, 1, peak_mb=600)
    assert any("limit" in p["message"] for p in json.loads(r.out)["problems"])


def test_rules_file_special_or_huge(base, tmp_path):
    d, ck = base
    engine = tmp_path / "e.npz"
    np.savez(engine, **{"blk.0": np.zeros((1, 3, 64), np.float32)})
    r = run_cli("diff", ck, engine, "--ids", "1,2,3", "--map", "/dev/zero", "--no-local")
    check(r, 2, "/dev/zero", "character device")
    fifo = tmp_path / "rules.json"
    os.mkfifo(fifo)
    r = run_cli("diff", ck, engine, "--ids", "1,2,3", "--map", fifo, "--no-local")
    check(r, 2, "rules.json", "FIFO")


# ------------------------------------------------------------------ user regexes

def test_catastrophic_regexes_are_time_bounded(base, tmp_path):
    d, ck = base
    r = run_cli("dump", ck, "--ids", "1,2,3", "--out", tmp_path / "x.safetensors", "--ops", "re:(.*){1,30}[bc]")
    check(r, 2, "ran longer than", "(.*){1,30}[bc]", cpu=30)
    engine = tmp_path / "e.npz"
    np.savez(engine, **{"layers.0.self_attn.q_proj.extra.long.name.abc.def.ghi": np.zeros((1, 3, 64), np.float32)})
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([["(.*){1,30}[yz]", "x"]]))
    r = run_cli("diff", ck, engine, "--ids", "1,2,3", "--map", rules, "--no-local")
    check(r, 2, "ran longer than", cpu=30)


@pytest.mark.parametrize("cmd", ["dump", "diff"])
def test_invalid_regex_is_one_line(base, tmp_path, cmd):
    d, ck = base
    if cmd == "dump":
        r = run_cli("dump", ck, "--ids", "1,2", "--out", tmp_path / "x.safetensors", "--ops", "re:(")
        check(r, 2, "re:(", "not a valid regular expression")
    else:
        rules = tmp_path / "rules.json"
        rules.write_text(json.dumps([["[a-", "x"]]))
        np.savez(tmp_path / "e.npz", a=np.zeros(3, np.float32))
        r = run_cli("diff", ck, tmp_path / "e.npz", "--ids", "1,2", "--map", rules)
        check(r, 2, "rule 0", "[a-")


# ------------------------------------------------------------------ near-linear inspection

def test_100k_unexpected_tensors_stay_fast(base):
    ck = copy(base, "100k-unexpected")
    hdr, data = header(ck / "model.safetensors")
    end = max(v["data_offsets"][1] for k, v in hdr.items() if k != "__metadata__")
    for i in range(100_000):
        hdr[f"model.layers.0.mlp.extra_{i}.weight"] = {"dtype": "U8", "shape": [0], "data_offsets": [end, end]}
    write_st(ck / "model.safetensors", hdr, data)
    r = run_cli("inspect", ck, "--json")
    check(r, 1, cpu=45)
    rep = json.loads(r.out)
    assert sum(p["code"] == "unexpected-tensor" for p in rep["problems"]) == 100_000


def test_index_naming_100k_missing_shards_stays_fast(base):
    ck = copy(base, "100k-shards")
    hdr, _ = header(ck / "model.safetensors")
    wm = {k: "model.safetensors" for k in hdr if k != "__metadata__"}
    for i in range(100_000):
        wm[f"model.layers.0.mlp.extra_{i}.weight"] = f"model-{i:06d}.safetensors"
    (ck / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    r = run_cli("inspect", ck, "--json")
    check(r, 1, cpu=45)
    assert sum(p["code"] == "missing-shard" for p in json.loads(r.out)["problems"]) == 100_000


# ------------------------------------------------------------------ one line, exit 2

def test_non_string_dtype_in_a_header(base, tmp_path):
    ck = copy(base, "dtype-list")
    hdr, data = header(ck / "model.safetensors")
    name = next(k for k in hdr if k.endswith("embed_tokens.weight"))
    hdr[name]["dtype"] = ["F32"]
    write_st(ck / "model.safetensors", hdr, data)
    r = run_cli("inspect", ck, "--json")
    check(r, 1)
    assert any("unknown dtype ['F32']" in p["message"] for p in json.loads(r.out)["problems"])
    r = run_cli("hunt", ck, "--ids", "1,2")
    check(r, 2, "embed_tokens")


@pytest.mark.parametrize("value", [[1], 7, None, {"a": 1}])
def test_non_string_model_type(base, value):
    ck = copy(base, "model-type")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["model_type"] = value
    (ck / "config.json").write_text(json.dumps(cfg))
    for cmd in (["inspect", ck], ["hunt", ck, "--ids", "1,2"]):
        r = run_cli(*cmd)
        if value is None:  # null: no model type at all, reported as such (not a crash)
            assert r.rc in (1, 2) and "Traceback" not in r.err, r
        else:
            check(r, 2, "model_type", "not a string")


def test_npz_member_claiming_2_to_the_40_elements(base, tmp_path):
    d, ck = base
    hdr = np.lib.format._wrap_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }",
                                     (1, 0)) if hasattr(np.lib.format, "_wrap_header") else None
    if hdr is None:
        import io
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
        hdr = buf.getvalue()
    with zipfile.ZipFile(tmp_path / "e.npz", "w") as z:
        z.writestr("layers.0.npy", hdr + b"\0" * 64)
    r = run_cli("diff", ck, tmp_path / "e.npz", "--ids", "1,2")
    check(r, 2, "layers.0", "claims shape", peak_mb=800)


def test_out_of_range_ids_in_dump_metadata(base, tmp_path):
    d, ck = base
    ref = tmp_path / "ref.safetensors"
    check(run_cli("dump", ck, "--ids", "1,2,3", "--out", ref, "--ops", "layers.0"), 0)
    hdr, data = header(ref)
    for bad in ([10 ** 12, 1, 2], [-5, 1, 2]):
        hdr["__metadata__"]["workbench.ids"] = json.dumps(bad)
        forged = tmp_path / "forged.safetensors"
        write_st(forged, hdr, data)
        r = run_cli("diff", forged, ref)  # the reference dump as the reference: its ids drive the model
        check(r, 2, "token id" if bad[0] >= 0 else "not a list of token ids", "workbench.ids")


def test_plot_to_a_missing_or_unwritable_place(base, tmp_path):
    d, ck = base
    ref = tmp_path / "ref.safetensors"
    check(run_cli("dump", ck, "--ids", "1,2,3", "--out", ref), 0)
    r = run_cli("diff", ck, ref, "--ids", "1,2,3", "--no-local", "--plot", tmp_path / "nowhere" / "x.png")
    check(r, 2, "nowhere", "does not exist")
    r = run_cli("diff", ck, ref, "--ids", "1,2,3", "--no-local", "--plot", "/proc/x.png")
    check(r, 2, "/proc/x.png")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() != 0:  # (root writes anywhere)
        r = run_cli("diff", ck, ref, "--ids", "1,2,3", "--no-local", "--plot", ro / "x.png")
        check(r, 2, "x.png")


def test_lab_with_a_bad_ip():
    r = run_cli("lab", "--ip", "not.an.ip", "--dry-run")
    check(r, 2, "not.an.ip", "not an IP address")


@pytest.mark.parametrize("which", ["model.safetensors", "config.json"])
def test_unreadable_file_is_reported_as_unreadable(base, which):
    ck = copy(base, f"unreadable-{which}")
    (ck / which).chmod(0o000)
    deny = which if os.geteuid() == 0 else None  # (root: the child's open is refused, see _CHILD)
    for cmd in (["inspect", ck], ["hunt", ck, "--ids", "1,2"]):
        r = run_cli(*cmd, deny=deny)
        check(r, 2, which, "cannot be read", "Permission denied")
        assert "missing" not in r.err and "unsupported" not in r.err and "unknown" not in r.err


# ------------------------------------------------------------------ disk space, spill directory

def test_spill_checks_free_space_first(monkeypatch, tmp_path):
    import mlx.core as mx

    from workbench.trace import store as S

    st = S.ValueStore(budget=0, spill_dir=str(tmp_path))
    monkeypatch.setattr(S.fsio, "free_bytes", lambda p: 1000)
    with pytest.raises(S.SpillError, match=r"spilling 'x' .* free"):
        st.put("x", mx.zeros((1024,)))
    assert not any(Path(st.directory).iterdir())  # nothing half-written
    st.close()
    assert not Path(st.directory).exists()


def test_spill_directory_and_temporaries_removed_on_sigterm(tmp_path):
    code = f"""
import os, signal, sys
import mlx.core as mx
from workbench import fsio
from workbench.trace.store import ValueStore
st = ValueStore(budget=0, spill_dir={str(tmp_path / 'spill')!r})
st.put("a", mx.zeros((256,)))
st.put("b", mx.zeros((256,)))
assert len(os.listdir(st.directory)) >= 1
with fsio.atomic_write({str(tmp_path / 'out.bin')!r}) as f:
    f.write(b"x" * 100)
    print(st.directory, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGTERM, p.stderr
    spill = Path(p.stdout.strip())
    assert spill.parent == tmp_path / "spill" and not spill.exists()
    assert sorted(os.listdir(tmp_path)) == ["spill"]  # no out.bin, no temporary
    assert os.listdir(tmp_path / "spill") == []


# ------------------------------------------------------------------ security: links

def test_link_at_the_temporary_name_is_left_untouched(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(fsio, "_token", lambda: next(names))
    link = tmp_path / ".out.bin.planted.tmp"
    link.symlink_to(victim)
    fsio.write_bytes(tmp_path / "out.bin", b"new content")
    assert victim.read_bytes() == b"precious"
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert (tmp_path / "out.bin").read_bytes() == b"new content"
    assert not (tmp_path / "out.bin").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.bin.planted.tmp", "out.bin", "victim"]


def test_link_at_the_final_name_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "out.png"
    out.symlink_to(victim)
    for write in (lambda: fsio.write_bytes(out, b"x"), lambda: fsio.write_with(out, lambda p: open(p, "wb").close())):
        with pytest.raises(fsio.WriteError, match="symbolic link"):
            write()
    assert victim.read_bytes() == b"precious" and out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png", "victim"]  # no temporaries left


def test_dump_never_writes_through_a_planted_link(base, tmp_path):
    d, ck = base
    victim = tmp_path / "victim.safetensors"
    shutil.copy(ck / "model.safetensors", victim)
    before = victim.read_bytes()
    out = tmp_path / "ref.safetensors"
    (tmp_path / "ref.safetensors.tmp").symlink_to(victim)  # the old predictable temporary name
    check(run_cli("dump", ck, "--ids", "1,2,3", "--out", out), 0)
    assert victim.read_bytes() == before and out.is_file() and not out.is_symlink()
    assert (tmp_path / "ref.safetensors.tmp").is_symlink()
    out.unlink()
    out.symlink_to(victim)  # a link at the final name
    r = run_cli("dump", ck, "--ids", "1,2,3", "--out", out)
    check(r, 2, "ref.safetensors")  # refused (a link; or, read through it, not a dump of ours)
    assert victim.read_bytes() == before and out.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ref")]


def test_written_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        fsio.write_text(tmp_path / "a.json", "{}")
        fsio.write_with(tmp_path / "b.bin", lambda p: Path(p).write_bytes(b"1"))
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o644


# ------------------------------------------------------------------ security: native cache

def _compile_in(d):
    from workbench.checkpoint import values_native as V

    return V.compile_kernels(str(d))


def test_native_cache_must_be_private_and_untampered(tmp_path):
    from workbench.checkpoint import values_native as V

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the native kernels are never built here")
    cache = tmp_path / "cache"
    lib = _compile_in(cache)
    assert lib is not None and cache.stat().st_mode & 0o777 == 0o700
    cache.chmod(0o770)  # group-writable
    with pytest.raises(V.NativeRefused, match="writable by group"):
        _compile_in(cache)
    cache.chmod(0o757)
    with pytest.raises(V.NativeRefused, match="writable by others"):
        _compile_in(cache)
    cache.chmod(0o700)
    assert _compile_in(cache) is not None
    so = next(cache.glob("*.so"))
    raw = so.read_bytes()
    so.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))  # tampered (content no longer hashes to its record)
    with pytest.raises(V.NativeRefused, match="content hash"):
        _compile_in(cache)
    fresh = tmp_path / "fresh"
    _compile_in(fresh)
    if os.geteuid() == 0:
        os.chown(fresh, 65534, 65534)  # foreign-owned
        with pytest.raises(V.NativeRefused, match="owned by uid 65534"):
            _compile_in(fresh)
    shared = tmp_path / "shared"  # a cache inside a world-writable, non-sticky directory
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(V.NativeRefused, match="writable by group or others"):
        _compile_in(shared / "cache")


def test_refused_cache_means_no_native_kernels(tmp_path, monkeypatch):
    from workbench.checkpoint import values_native as V

    cache = tmp_path / "c"
    cache.mkdir(mode=0o775)
    cache.chmod(0o775)
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache))
    monkeypatch.setattr(V, "_LIB", None)
    monkeypatch.setattr(V, "NATIVE", True)
    assert V.native() is None
    assert "writable by group" in V.NATIVE_REFUSED
    assert not list(cache.iterdir())  # nothing compiled into it, nothing loaded from it


# ------------------------------------------------------------------ security: the lab's token

def test_lab_token_is_on_no_command_line(tmp_path):
    served = tmp_path / "nb"
    served.mkdir()
    shutil.copy(REPO / "notebooks" / "01_tour.ipynb", served)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws")}
    p = subprocess.Popen([sys.executable, "-m", "workbench.cli", "lab", str(served), "--ip", "127.0.0.1",
                          "--port", "0", "--no-browser", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        info = json.loads(p.stdout.readline())
        token = info["url"].split("token=")[1]
        assert len(token) >= 32 and not any(token in a for a in info["command"])
        base = info["url"].split("/lab/")[0]
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=5) as r:
                    page = r.read().decode()
                break
            except OSError:
                assert p.poll() is None, "workbench lab exited"
                assert time.monotonic() < deadline, "JupyterLab did not answer in 120 s"
                time.sleep(0.5)
        # the server is up (and authenticates with the token): no process shows it on its command line
        seen = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    seen.append(Path(f"/proc/{pid}/cmdline").read_bytes())
                except OSError:
                    pass
        assert len(seen) > 1 and not [c for c in seen if token.encode() in c]
        with pytest.raises(urllib.error.HTTPError):  # and the token is required
            urllib.request.urlopen(f"{base}/api/contents", timeout=5)
        # no "official Jupyter news?" prompt: the announcements plugin is disabled, no feed fetched
        assert "@jupyterlab/apputils-extension:announcements" in page
        assert '"news": {"disabled": true}' in page
    finally:
        p.terminate()
        p.wait(timeout=60)


def test_a_prompt_whose_attention_cannot_fit_is_refused_before_running(tmp_path):
    """A 60,000-token prompt on the demo with explicit attention: one line, exit 2, the limit named;
    memory stays small.  Fused attention (the default) materialises no scores: not refused."""
    from workbench.demo.paths import DEMO
    from workbench.trace.entry import check_attention_memory
    import workbench
    from workbench.trace import TraceError

    model = workbench.load(DEMO)
    explicit = model.program_for("explicit")
    with pytest.raises(TraceError, match=r"needs \d+\.\d GiB .*attention='fused'.* or a shorter prompt"):
        check_attention_memory(explicit, 1, 30000, 30000, model.default_dtype, available=2**30)
    check_attention_memory(explicit, 1, 64, 64, model.default_dtype, available=2**30)  # fits: no error
    check_attention_memory(model.program, 1, 30000, 30000, model.default_dtype, available=2**30)  # fused
    ids = ",".join(["5"] * 60000)  # 54 GiB of bfloat16 scores: refused on any machine this runs on
    r = run_cli("hunt", DEMO, "--ids", ids, "--attention", "explicit")
    check(r, 2, "shorter prompt", peak_mb=2048)  # one line, exit 2, under 2 GiB (its own peak)
