"""The native kernels of ``inspect --values``: one fused pass per chunk in C (every element
examined: counts by kind, min / max of the finite values, shifted sums for mean / std),
compiled on first use from values_native.c (beside this file) with the system C compiler
into a per-user cache and loaded with ctypes (calls release the GIL, so worker threads run
in parallel).

The cache is trusted only when it is private (owned by this user, writable by no one else,
below directories only this user or root can change) and the library's bytes hash to the
digest recorded when it was compiled; they are loaded from an anonymous memory file.
Without a compiler, with WORKBENCH_NATIVE=0, or with a cache that cannot be trusted
(``NATIVE_REFUSED`` says why), :func:`native` is None and values.py uses numpy; tests check
that both give the same statistics.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading

NATIVE = os.environ.get("WORKBENCH_NATIVE", "1") != "0"

#: the kernels' C source, shipped beside this module (package data), read when compiling
C_SOURCE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "values_native.c")


def _c_source() -> str | None:
    """The kernels' source, or None when the installed package lacks it (numpy is used then)."""
    from workbench import fsio

    try:
        return fsio.read_bytes(C_SOURCE_FILE, 1 << 20, "workbench's native kernel source").decode("utf-8")
    except (OSError, fsio.InputFileError, UnicodeDecodeError):
        return None


_LIB = None
_LIB_LOCK = threading.Lock()


class Acc(ctypes.Structure):
    _fields_ = [(k, ctypes.c_int64) for k in ("n", "nan", "posinf", "neginf", "zeros", "have_k")] + \
               [(k, ctypes.c_double) for k in ("min", "max", "k", "s1", "s2")]


class NativeRefused(Exception):
    """The native kernels' cache cannot be trusted (owner, mode, content hash)."""


#: why the native kernels are not in use (None: in use, or not tried yet)
NATIVE_REFUSED: str | None = None


def cache_dir() -> str:
    d = os.environ.get("WORKBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "workbench")
    return d


def _check_dir(d: str) -> None:
    """Native code is loaded only from a directory owned by this user and writable by no one
    else, below directories that only this user or root can change (sticky ones aside)."""
    import stat

    me = os.geteuid()
    st = os.stat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise NativeRefused(f"{d} is not a directory")
    if st.st_uid != me:
        raise NativeRefused(f"{d} is owned by uid {st.st_uid}, not by this user (uid {me})")
    if st.st_mode & 0o022:
        raise NativeRefused(f"{d} is writable by {'group' if st.st_mode & 0o020 else 'others'} "
                            f"(mode {stat.S_IMODE(st.st_mode):o})")
    up = os.path.dirname(os.path.realpath(d))
    while True:
        pst = os.stat(up)
        if pst.st_uid not in (me, 0):
            raise NativeRefused(f"{d}: its parent {up} is owned by uid {pst.st_uid}")
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            raise NativeRefused(f"{d}: its parent {up} is writable by group or others")
        nxt = os.path.dirname(up)
        if nxt == up:
            return
        up = nxt


def _read_own(path: str, cap: int) -> bytes:
    """A file of ours in the checked cache: no link followed, regular, owned by this user,
    writable by no one else."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise NativeRefused(f"{path}: not a regular file owned by this user and writable only by it")
        if st.st_size > cap:
            raise NativeRefused(f"{path}: {st.st_size} bytes, larger than expected")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(st.st_size)
    finally:
        os.close(fd)


def _load_bytes(data: bytes, fallback: str) -> "ctypes.CDLL":
    """Load exactly these bytes (an anonymous memory file where the OS has one: nothing on
    disk can be swapped in between the hash check and the load)."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            fd = memfd("wb_values", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            fd = None
        if fd is not None:
            try:
                os.write(fd, data)
                return ctypes.CDLL(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)  # (the loaded mapping stays valid)
    return ctypes.CDLL(fallback)


def compile_kernels(d: str | None = None) -> "ctypes.CDLL | None":
    """Compile (once per source / compiler / machine; cached in ``d``) and load the kernels.
    The cached library is named by its SHA-256, recorded in ``wb_values_<tag>.sha256`` when
    we compiled it; it is loaded only if the directory passes :func:`_check_dir` and its
    bytes hash to that name.  Raises NativeRefused when the cache cannot be trusted."""
    import hashlib
    import platform
    import shutil
    import subprocess
    import tempfile

    from workbench import fsio

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    c_src = _c_source()
    if c_src is None:
        return None
    tag = hashlib.sha256((c_src + cc + platform.machine() + platform.node()).encode()).hexdigest()[:16]
    d = d or cache_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError:
        return None
    _check_dir(d)
    pointer = os.path.join(d, f"wb_values_{tag}.sha256")
    data = digest = None
    if os.path.lexists(pointer):
        digest = _read_own(pointer, 128).decode("ascii", "replace").strip()
        so = os.path.join(d, f"wb_values_{tag}_{digest[:32]}.so")
        if len(digest) == 64 and os.path.lexists(so):
            data = _read_own(so, 64 << 20)
            if hashlib.sha256(data).hexdigest() != digest:
                raise NativeRefused(f"{so}: content hash differs from the one recorded when it was compiled")
    if data is None:
        with tempfile.TemporaryDirectory(dir=d) as tmp:  # (mkdtemp: private, created exclusively)
            src = os.path.join(tmp, "wb_values.c")
            out = os.path.join(tmp, "wb_values.so")
            with open(src, "w") as f:
                f.write(c_src)
            base = [cc, "-O3", "-ffp-contract=off", "-shared", "-fPIC", src, "-o", out]
            for extra in (["-march=native"], ["-mcpu=native"], [], ["-DWB_NO_F16"]):
                try:
                    r = subprocess.run(base + extra, capture_output=True, timeout=120, cwd=tmp)  # (not the user's folder)
                except (OSError, subprocess.SubprocessError):
                    return None
                if r.returncode == 0:
                    break
            else:
                return None
            with open(out, "rb") as f:
                data = f.read()
            digest = hashlib.sha256(data).hexdigest()
            so = os.path.join(d, f"wb_values_{tag}_{digest[:32]}.so")
            os.chmod(out, 0o600)
            os.replace(out, so)  # atomic: concurrent first uses see a whole file (named by its content)
        fsio.write_text(pointer, digest + "\n")
    lib = _load_bytes(data, so)
    P, I64, A = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(Acc)
    lib.wb_f32.argtypes = [P, I64, A]
    lib.wb_bf16.argtypes = [P, I64, A]
    lib.wb_affine.argtypes = [P, P, P, ctypes.c_int, I64, I64, ctypes.c_int, I64, A]
    lib.wb_affine.restype = ctypes.c_int
    return lib


def native():
    """The compiled kernels, or None (no compiler, WORKBENCH_NATIVE=0 / NATIVE False,
    or a cache that cannot be trusted: the reason is in ``NATIVE_REFUSED``)."""
    global _LIB, NATIVE_REFUSED
    if not NATIVE:
        return None
    if _LIB is None:
        with _LIB_LOCK:
            if _LIB is None:
                try:
                    _LIB = compile_kernels() or False
                except NativeRefused as e:
                    NATIVE_REFUSED = f"native kernels not loaded: {e}"
                    _LIB = False
                except OSError:
                    _LIB = False
    return _LIB or None


def new_acc() -> Acc:
    a = Acc()
    a.min, a.max = math.inf, -math.inf
    return a
