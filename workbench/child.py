"""Python children of ours that run only our code and die with their parent.

A child started as ``python -m workbench.something`` in the user's working directory puts
that directory first on ``sys.path``: a ``json.py`` or a ``workbench/`` folder lying in a
checkpoint folder (``cd model && workbench hunt . --crash``) would be imported and run.
So every Python child we start (the crash hunt's, the lab's server) is:

* **isolated**: ``python -I`` (no working directory, ``PYTHON*`` variables or user site on
  ``sys.path``) with ``sys.path`` set to this process's own, less the working directory
  (:func:`import_path`), passed on its command line; and started in :data:`SAFE_CWD`;
* **in a session of its own** (``start_new_session``), so :func:`kill_group` ends it and
  anything it started;
* **tied to its parent** (:func:`die_with_parent`, called first thing in the child): on
  Linux the kernel kills it when the parent dies (``PR_SET_PDEATHSIG``), elsewhere a
  watcher thread does once the parent is gone.

:func:`drop_working_directory` is the same rule for our own entry point: run as
``python -m workbench.cli`` (the form ``mlx.launch`` starts), the working directory is
taken off ``sys.path`` before any later import can come from it.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

#: where a child starts: nothing of the user's, nothing on its import path
SAFE_CWD = os.path.abspath(os.sep)

#: the child's first code (``python -I -c BOOT PATHS MODULE ARGS...``): this import path,
#: then the module run as ``__main__`` with ARGS as its ``sys.argv[1:]``
BOOT = ("import sys, json, runpy; p = json.loads(sys.argv[1]); "
        "sys.path[:] = p + [x for x in sys.path if x not in p]; m = sys.argv[2]; del sys.argv[1:3]; "
        "runpy.run_module(m, run_name='__main__', alter_sys=True)")

_PR_SET_PDEATHSIG = 1


def _package_root() -> str:
    """The folder holding the ``workbench`` package (our code, wherever the user stands)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def import_path(cwd: str | None = None) -> list[str]:
    """This process's ``sys.path`` for a child, in its order: absolute entries only, without
    the working directory (``''`` or the folder itself) unless our package lives there, and
    our package's folder last if it was not on it (found through an import hook)."""
    cwd = os.getcwd() if cwd is None else cwd
    root = _package_root()
    out = []
    for p in sys.path:
        if not p or not os.path.isabs(p) or p in out:
            continue
        if _same_dir(p, cwd) and not _same_dir(p, root):
            continue
        out.append(p)
    if not any(_same_dir(p, root) for p in out):
        out.append(root)
    return out


def python_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """The command line that runs ``python -m MODULE ARGS`` isolated (see the module's doc)."""
    return [python or sys.executable, "-I", "-c", BOOT, json.dumps(import_path()), module, *args]


def popen_options() -> dict:
    """Keyword arguments for ``subprocess.Popen`` of a child: a safe working directory and a
    session (process group) of its own."""
    return {"cwd": SAFE_CWD, "start_new_session": True, "close_fds": True}


def kill_group(proc) -> None:
    """SIGKILL the child's process group (it and anything it started), if still there."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent(parent: int) -> None:
    """In the child: end this process when ``parent`` (its parent's pid) is gone.  Linux: the
    kernel's parent-death signal (SIGKILL, nothing in the child can delay it); elsewhere a
    daemon thread that polls for the parent every half second.  If the parent already died
    (we were adopted), exit now."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:
        os._exit(1)
    if armed:
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="workbench-parent-watch", daemon=True).start()


def drop_working_directory() -> None:
    """Take the working directory off ``sys.path`` (where ``python -m`` / ``-c`` put it), unless
    our own package lives there (a source checkout run from its root)."""
    cwd = os.getcwd()
    root = _package_root()
    keep = []
    for p in sys.path:
        p = p or cwd
        if _same_dir(p, cwd) and not _same_dir(p, root):
            continue
        keep.append(p)
    sys.path[:] = keep
