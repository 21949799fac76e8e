"""Files in and out, defensively: the one place workbench opens inputs and writes outputs.

Reading (:func:`open_regular`, :func:`read_bytes`, :func:`read_json`): only regular files
are opened (a FIFO, device or socket is refused by name, without blocking on it), and a
size cap is checked against ``fstat`` before anything is read, so ``/dev/zero`` or a
huge file is never read whole.  Failures raise :class:`InputFileError` (a ValueError)
naming the file.

Writing (:func:`atomic_write`, :func:`write_bytes`, :func:`write_text`,
:func:`write_json`, :func:`write_with`): every file goes to a temporary created
exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, random name) in the
destination's directory and is renamed into place when complete, then given the usual
mode (0666 less the umask).  The commands check each output path first
(:func:`check_destination`): an existing file is not replaced unless workbench wrote it
(a dump over a dump); none is replaced silently.  A symbolic link at the temporary name makes the create fail
(another name is tried); a link at the final name is refused, never followed or replaced.
Writers that only take a path (``mx.save_safetensors``, ``savefig``, ``np.savez``) write
into a private 0700 directory made next to the destination (:func:`write_with`).
Temporaries and private directories (also the trace's spill directory,
:func:`private_dir`) are removed when the writer fails, on SIGINT (KeyboardInterrupt) and
on SIGTERM.  Failures raise :class:`WriteError` (an OSError) naming the destination.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import stat
import tempfile
import threading

#: default size caps for JSON inputs (bytes)
MAX_CONFIG = 50_000_000
MAX_INDEX = 200_000_000
MAX_RULES = 10_000_000


class InputFileError(ValueError):
    """An input file that cannot be used (not a regular file, too large, unreadable, bad
    JSON); the message names the file."""


class WriteError(OSError):
    """An output that cannot be written (missing or read-only directory, a link at the
    destination, a full disk); the message names the destination."""

    def __str__(self):  # one line, ours (OSError's default adds "[Errno None]")
        return self.args[0] if self.args else "write failed"


# ---------------------------------------------------------------------------- reading

_KIND = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str:
    for test, name in _KIND:
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path, what: str | None = None) -> os.stat_result:
    """``os.stat`` of ``path`` (links followed), or InputFileError unless it is a regular file."""
    what = what or str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what}: no such file") from None
    except OSError as e:
        raise InputFileError(f"{what}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a regular file: refused")
    return st


def open_regular(path, what: str | None = None):
    """Open ``path`` for binary reading, only if it is a regular file.  The open itself is
    non-blocking (a FIFO swapped in after a check cannot hang it); ``fstat`` decides."""
    what = what or str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputFileError(f"{what}: no such file") from None
    except OSError as e:
        raise InputFileError(f"{what}: cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a regular file: refused")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, cap: int, what: str | None = None) -> bytes:
    """The whole file, refused (before reading) if it is larger than ``cap`` bytes."""
    what = what or str(path)
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise InputFileError(f"{what} is {size} bytes, over the {_mb(cap)} limit for this kind of file: refused")
        try:  # (read(n) allocates n bytes up front: ask for the size fstat gave, in pieces past it)
            parts = [f.read(size + 1)]
            total = len(parts[0])
            while total > size and parts[-1]:  # grew while being read
                parts.append(f.read(1 << 20))
                total += len(parts[-1])
                if total > cap:
                    raise InputFileError(f"{what} is over the {_mb(cap)} limit for this kind of file: refused")
        except OSError as e:
            raise InputFileError(f"{what}: cannot be read ({e.strerror or e})") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_json(path, cap: int, what: str | None = None, **loads_kw):
    """Parse a JSON file (UTF-8) of at most ``cap`` bytes; errors name the file and byte."""
    what = what or str(path)
    raw = read_bytes(path, cap, what)
    try:
        return json.loads(raw.decode("utf-8"), **loads_kw)
    except UnicodeDecodeError as e:
        raise InputFileError(f"{what} is not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise InputFileError(f"{what}: not JSON ({e.msg} at byte {e.pos})") from None
    except RecursionError:
        raise InputFileError(f"{what}: JSON nested too deeply") from None
    except ValueError as e:
        raise InputFileError(f"{what} cannot be parsed: {e}") from None


def _mb(n: int) -> str:
    return f"{n / 1e6:g} MB"


# ---------------------------------------------------------------------------- writing

_LIVE: dict[str, bool] = {}  # temporaries and private directories to remove on a signal (path -> is_dir)
_LIVE_LOCK = threading.Lock()
_HANDLED: set = set()


def _token() -> str:
    return secrets.token_hex(6)


def register(path: str, is_dir: bool = False) -> None:
    """Remove ``path`` (a file, or a directory tree) if the process gets SIGTERM (or SIGINT)
    before :func:`unregister`."""
    with _LIVE_LOCK:
        _LIVE[str(path)] = is_dir
    _install_handlers()


def unregister(path: str) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(str(path), None)


def cleanup() -> None:
    """Remove every registered temporary now."""
    with _LIVE_LOCK:
        items = list(_LIVE.items())
        _LIVE.clear()
    for p, is_dir in items:
        try:
            if is_dir:
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass


def _install_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None or sig in _HANDLED:
            continue
        try:
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN:
                continue
            signal.signal(sig, _make_handler(sig, prev))
            _HANDLED.add(sig)
        except (ValueError, OSError):  # not the main interpreter / thread
            pass


def _make_handler(sig, prev):
    def handler(signum, frame):
        cleanup()
        if callable(prev):
            return prev(signum, frame)
        signal.signal(signum, signal.SIG_DFL if prev is None else prev)
        os.kill(os.getpid(), signum)  # die of the signal, as without us
    return handler


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _target(dest) -> tuple[str, str, str]:
    """(dest, its directory, its base name), after checking the destination: its directory
    exists, and the name is not a link or a non-regular file."""
    dest = os.fspath(dest)
    parent, base = os.path.split(os.path.abspath(dest))
    if not base:
        raise WriteError(f"{dest}: not a file name")
    if not os.path.isdir(parent):
        raise WriteError(f"{dest}: directory {parent} does not exist")
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise WriteError(f"{dest}: cannot be written ({e.strerror or e})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise WriteError(f"{dest} is a symbolic link: refusing to write through or replace it")
        if not stat.S_ISREG(st.st_mode):
            raise WriteError(f"{dest} is {kind_of(st.st_mode)}: refusing to replace it")
    return dest, parent, base


def check_destination(dest, replaceable=None, kind: str | None = None) -> None:
    """Fail early (WriteError naming it) if ``dest`` cannot be written: its directory is
    missing or not writable, the name is a link or not a regular file, or a file is there
    already.  The one rule for every output path: an existing file is never replaced
    silently; only one that ``replaceable(dest)`` recognises as written by workbench
    (``kind``: what it is, e.g. "a workbench dump") may be (``dump --out``); None: none
    may (a plot, a .npy, which carry no mark of their writer)."""
    dest, parent, _ = _target(dest)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise WriteError(f"{dest}: directory {parent} is not writable")
    if os.path.lexists(dest) and (replaceable is None or not replaceable(dest)):
        what = f" and is not {kind}" if replaceable is not None and kind else ""
        raise WriteError(f"{dest} exists{what}: not overwriting it (remove it first or choose another name)")


def _create_temp(parent: str, base: str) -> tuple[int, str]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(16):
        tmp = os.path.join(parent, f".{base[:100]}.{_token()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileExistsError:  # someone else's file or link: never touched, another name tried
            continue
        except OSError as e:
            raise WriteError(f"{os.path.join(parent, base)}: cannot write in {parent} ({e.strerror or e})") from None
        register(tmp)
        return fd, tmp
    raise WriteError(f"{os.path.join(parent, base)}: could not create a temporary file in {parent}")


def _place(tmp: str, dest: str) -> None:
    """Rename a finished temporary over ``dest`` (rename never follows a link at ``dest``)."""
    _target(dest)  # (re-checked just before: a link planted meanwhile is refused)
    try:
        os.replace(tmp, dest)
    except OSError as e:
        raise WriteError(f"{dest}: cannot be put in place ({e.strerror or e})") from None


def _disk_error(dest: str, e: OSError) -> WriteError:
    return WriteError(f"{dest}: write failed ({e.strerror or e})")


@contextlib.contextmanager
def atomic_write(dest, mode: str = "wb", encoding: str = "utf-8"):
    """``with atomic_write(path) as f: f.write(...)``: the file appears at ``path`` whole,
    or not at all."""
    dest, parent, base = _target(dest)
    fd, tmp = _create_temp(parent, base)
    done = False
    try:
        f = os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": encoding}))
        with f:
            try:
                yield f
                f.flush()
            except OSError as e:
                if isinstance(e, WriteError):
                    raise
                raise _disk_error(dest, e) from None
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        _place(tmp, dest)
        done = True
    finally:
        unregister(tmp)
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_bytes(dest, data: bytes) -> None:
    with atomic_write(dest) as f:
        f.write(data)


def write_text(dest, text: str) -> None:
    with atomic_write(dest, "w") as f:
        f.write(text)


def write_json(dest, obj, **dumps_kw) -> None:
    write_text(dest, json.dumps(obj, **dumps_kw))


def private_dir(parent=None, prefix: str = "workbench-") -> str:
    """A new directory only we can use (``mkdtemp``: created exclusively, mode 0700), removed
    on SIGTERM / SIGINT until :func:`unregister`\\ ed.  ``parent`` None: the system temp dir."""
    try:
        d = tempfile.mkdtemp(prefix=prefix, dir=None if parent is None else os.fspath(parent))
    except OSError as e:
        raise WriteError(f"cannot create a directory in {parent or tempfile.gettempdir()} "
                         f"({e.strerror or e})") from None
    register(d, is_dir=True)
    return d


def write_with(dest, writer) -> None:
    """For writers that take a path: ``writer(tmp_path)`` writes the file inside a private
    directory next to ``dest`` (same name, so the extension is kept); then it is renamed
    into place.  ``write_with("a.png", fig.savefig)``."""
    dest, parent, base = _target(dest)
    try:
        d = private_dir(parent, prefix=f".{base[:100]}.")
    except WriteError as e:
        raise WriteError(f"{dest}: {e}") from None
    try:
        tmp = os.path.join(d, base)
        try:
            writer(tmp)
        except OSError as e:
            raise _disk_error(dest, e) from None
        except ValueError as e:  # e.g. savefig: an image format it does not know
            raise WriteError(f"{dest}: cannot be written ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        except RuntimeError as e:  # MLX reports write failures as RuntimeError
            raise WriteError(f"{dest}: write failed ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        try:
            st = os.lstat(tmp)
        except FileNotFoundError:
            raise WriteError(f"{dest}: the writer produced no file") from None
        if not stat.S_ISREG(st.st_mode):
            raise WriteError(f"{dest}: the writer produced {kind_of(st.st_mode)}")
        os.chmod(tmp, 0o666 & ~_umask())
        _place(tmp, dest)
    finally:
        unregister(d)
        shutil.rmtree(d, ignore_errors=True)


def free_bytes(path) -> int | None:
    """Free space (bytes) on the filesystem holding ``path``, or None if unknown."""
    try:
        return shutil.disk_usage(os.fspath(path)).free
    except OSError:
        return None


__all__ = ["InputFileError", "WriteError", "check_regular", "check_destination", "open_regular", "read_bytes", "read_json",
           "atomic_write", "write_bytes", "write_text", "write_json", "write_with", "private_dir",
           "register", "unregister", "cleanup", "free_bytes"]
