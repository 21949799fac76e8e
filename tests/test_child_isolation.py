"""Children run only our code and die with their parent (issue 41, item 1).

The crash hunt used to start its child as ``python -m workbench.trace.crash`` in the user's
working directory, so ``cd model && workbench hunt . --crash`` imported a ``json.py`` lying
in the checkpoint folder.  Here every module the child (or the lab's server) imports early
is planted in the working directory as a file that leaves a marker when imported, and the
real command runs there: no marker may appear.  A killed parent takes its child with it, a
hang leaves no process behind, and a planted-crash variable is named in every report.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from workbench import child
from workbench.trace.crash import CRASH_AT_ENV, _result, crash_hunt

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo"
#: modules a Python child imports on its way to our code (the boot, the crash child, the
#: lab's server), and the packages they import: each planted, each must stay unimported
PLANTED = ("json", "select", "signal", "selectors", "runpy", "subprocess", "threading", "ctypes",
           "tempfile", "numpy", "mlx", "safetensors", "tokenizers", "jupyterlab", "workbench")


def plant_modules(folder: Path, marker_dir: Path) -> None:
    """In ``folder``: ``NAME.py`` (and a ``workbench/`` package) that, when imported, write
    ``marker_dir/NAME`` and exit 0 (as a planted module that pretends all went well)."""
    for name in PLANTED:
        code = f"open({str(marker_dir / name)!r}, 'w').close()\nimport os\nos._exit(0)\n"
        if name == "workbench":
            (folder / name).mkdir(exist_ok=True)
            (folder / name / "__init__.py").write_text(code)
        else:
            (folder / f"{name}.py").write_text(code)


@pytest.fixture
def hostile(tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(DEMO, ck)
    markers = tmp_path / "markers"
    markers.mkdir()
    plant_modules(ck, markers)
    return ck, markers


def workbench_script(*args, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    """The ``workbench`` console script, as a user runs it (its folder, not the working
    directory, is first on its path)."""
    script = Path(sys.executable).parent / "workbench"
    assert script.exists(), f"no workbench console script beside {sys.executable}"
    return subprocess.run([str(script), *args], cwd=cwd, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def test_crash_hunt_imports_nothing_from_the_working_directory(hostile):
    """The issue's repro: ``cd ck && workbench hunt . --crash --ids 1,2,3`` with modules planted."""
    ck, markers = hostile
    p = workbench_script("hunt", ".", "--crash", "--ids", "1,2,3", "--json", cwd=ck)
    assert p.returncode == 0 and p.stderr == "", p
    assert sorted(os.listdir(markers)) == [], p  # nothing planted ran, in the parent or the child
    report = json.loads(p.stdout)
    assert report["crash"] is None and report["steps_completed"] == report["steps"] > 100


def test_a_crash_found_from_a_hostile_folder_is_the_real_one(hostile):
    """Planted modules that exit 0 once gave 'crash before the first step: exit code 0'; now
    the child runs to the planted step and reports it."""
    ck, markers = hostile
    p = workbench_script("hunt", ".", "--crash", "--ids", "1,2,3", "--json", cwd=ck,
                         env={CRASH_AT_ENV: "layers.1.mlp*:SEGV"})
    assert p.returncode == 1 and sorted(os.listdir(markers)) == [], p
    crash = json.loads(p.stdout)["crash"]
    assert crash["op"].startswith("layers.1.mlp") and crash["signal"] == "SIGSEGV"


def test_python_argv_keeps_the_working_directory_off_the_path(tmp_path):
    """``python_argv`` alone (started in a hostile folder, not in SAFE_CWD): -I and the carried
    import path keep the folder out; the module runs with its arguments."""
    markers = tmp_path / "markers"
    markers.mkdir()
    plant_modules(tmp_path, markers)
    argv = child.python_argv("json.tool", "--compact")
    p = subprocess.run(argv, input=b'{"a": [1, 2]}', capture_output=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == b'{"a":[1,2]}', p
    assert os.listdir(markers) == []
    assert str(tmp_path) not in child.import_path(cwd=str(tmp_path)) or tmp_path == REPO


def test_import_path_drops_the_working_directory_but_not_our_package(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), ".", "relative/dir", *sys.path])
    path = child.import_path(cwd=str(tmp_path))
    assert "" not in path and str(tmp_path) not in path and "." not in path and "relative/dir" not in path
    assert all(os.path.isabs(p) for p in path)
    root = str(REPO)
    assert root in child.import_path(cwd=root)  # a source checkout run from its root keeps itself


def test_python_m_cli_drops_the_working_directory(hostile):
    """``python -m workbench.cli`` (the form mlx.launch starts) puts the folder first on the
    path; what the CLI imports after it starts (numpy, mlx, safetensors...) never comes from
    there.  (The ``workbench`` package itself is found before any of our code runs: only the
    console script or ``python -I`` protect that.)"""
    ck, markers = hostile
    lazy = ("numpy", "mlx", "safetensors", "tokenizers")  # (imported once main runs, never before)
    shutil.rmtree(ck / "workbench")
    for f in ck.glob("*.py"):
        if f.stem not in lazy:
            f.unlink()
    env = dict(os.environ, PYTHONPATH=str(REPO))  # (our package found, as an installed one would be)
    p = subprocess.run([sys.executable, "-m", "workbench.cli", "inspect", ".", "--json"], cwd=ck, env=env,
                       capture_output=True, timeout=300)
    assert os.listdir(markers) == [], p.stderr[-2000:]
    assert p.returncode == 0 and json.loads(p.stdout)["ok"] is True, p.stderr[-2000:]


def test_lab_server_imports_nothing_from_its_folder(tmp_path):
    """``workbench lab PATH`` starts the server in PATH: a ``jupyterlab.py`` there stays unrun."""
    markers = tmp_path / "markers"
    markers.mkdir()
    folder = tmp_path / "nb"
    folder.mkdir()
    plant_modules(folder, markers)
    from workbench.lab import lab_argv

    argv = lab_argv(folder, open_browser=False) + ["--version"]
    p = subprocess.run(argv, cwd=folder, capture_output=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip()[:1].isdigit(), p
    assert os.listdir(markers) == []


# ------------------------------------------------------------------ dying with the parent

_PARENT = textwrap.dedent("""
    import os, sys
    from workbench.trace.crash import crash_hunt
    crash_hunt(sys.argv[1], [1, 2, 3], timeout=600)
""")


def _children_of(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"workbench.trace.crash" in cmd:
            out.append(int(d))
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state == "Z"  # (a zombie waiting for its new parent to reap it is dead)
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the child")
def test_a_killed_parent_takes_its_hung_child_with_it(tmp_path):
    env = dict(os.environ, **{CRASH_AT_ENV: "layers.0.*:hang"})
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(DEMO)], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        kids = []
        while not kids and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
            kids = _children_of(parent.pid)
        assert kids, "the crash hunt's child never appeared"
        time.sleep(2.0)  # (let it reach the planted hang)
        assert not _gone(kids[0])
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while not _gone(kids[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(kids[0]), f"child {kids[0]} outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for k in _children_of(parent.pid):
            os.kill(k, signal.SIGKILL)


_WATCHED = textwrap.dedent("""
    import os, subprocess, sys, time
    kid = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.platform = 'darwin'; "
                            "from workbench.child import die_with_parent; die_with_parent(int(sys.argv[1])); "
                            "print('armed', flush=True); time.sleep(600)", str(os.getpid())], stdout=subprocess.PIPE)
    assert kid.stdout.readline() == b"armed\\n"
    print(kid.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the child end")
def test_the_watcher_thread_where_there_is_no_parent_death_signal():
    """macOS has no PR_SET_PDEATHSIG: the watcher thread ends the child (tried here as if on macOS)."""
    parent = subprocess.Popen([sys.executable, "-c", _WATCHED], stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        kid = int(parent.stdout.readline())
        assert not _gone(kid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while not _gone(kid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(kid), "the watched child outlived its parent"
    finally:
        parent.kill()


def test_no_process_outlives_a_hang(monkeypatch):
    monkeypatch.setenv(CRASH_AT_ENV, "layers.0.*:hang")
    r = crash_hunt(str(DEMO), [1, 2, 3], timeout=3)
    assert r.finding.hung
    pid = next(m["pid"] for m in r.messages if m.get("pid"))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ------------------------------------------------------------------ the planted-crash variable

def test_the_planted_variable_is_named_in_every_report(monkeypatch, capsys):
    from workbench.cli import main

    monkeypatch.setenv(CRASH_AT_ENV, "no.such.op:FPE")  # set, matching nothing: no crash, still named
    r = crash_hunt(str(DEMO), [1, 2, 3])
    assert not r.found and r.report["planted"] == "no.such.op:FPE" and "planted" in str(r)
    assert main(["hunt", str(DEMO), "--crash", "--ids", "1,2,3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"note: {CRASH_AT_ENV}=no.such.op:FPE is set") and out[1].startswith("no crash")
    monkeypatch.setenv(CRASH_AT_ENV, "lm_head:abort")
    assert main(["hunt", str(DEMO), "--crash", "--ids", "1,2,3", "--json"]) == 1
    crash = json.loads(capsys.readouterr().out)["crash"]
    assert crash["planted"] == "lm_head:abort" and crash["causes"][0].startswith(f"planted by {CRASH_AT_ENV}")
    monkeypatch.delenv(CRASH_AT_ENV)
    r = crash_hunt(str(DEMO), [1, 2, 3])
    assert r.report["planted"] is None and "planted" not in str(r)


def test_an_exit_0_before_the_end_is_said_so():
    r = _result([{"event": "stage", "stage": "spec", "pid": 1}], False, 0, False, 0, "", 5.0, 1.0)
    assert r.found and r.finding.how == "exit code 0 before the forward finished"
