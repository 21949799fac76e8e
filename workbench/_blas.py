"""Put MLX on a fast BLAS on Linux CPU.

The Linux ``mlx`` CPU wheel links the reference (netlib) BLAS: a 1024^3 float32
matmul runs at ~6 GFLOP/s.  Loading an OpenBLAS with ``RTLD_GLOBAL`` *before*
``mlx.core`` is first imported makes MLX's ``cblas_*``/``sgemm_`` symbols resolve
to it (~200 GFLOP/s on 2 cores).  This module must be imported before anything
imports ``mlx.core``; ``workbench/__init__.py`` does that first thing.

Search order: ``$WORKBENCH_BLAS`` (an absolute path to a libopenblas.so, or ``off``), the
``cmeel-openblas`` wheel (in an installed site-packages, never the working directory), Debian/Ubuntu's libopenblas packages, any
``libopenblas.so.0`` the dynamic loader can find.  On macOS nothing changes
(MLX uses Accelerate and Metal).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import sysconfig
import warnings

#: what happened, for ``workbench.blas_status()`` and the CLI's ``--version``
STATUS: dict = {"loaded": None, "reason": None, "tried": []}


def _site_dirs() -> list[str]:
    """The installed-package directories (this environment's site-packages, the user's),
    never the working directory: ``python -m`` puts the current directory first on
    sys.path, so only absolute site-packages / dist-packages entries of it count."""
    import site

    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # pragma: no cover - an old virtualenv's site module
        pass
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs += [p for p in sys.path if p and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")]
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # a deleted working directory
        cwd = None
    out = []
    for d in dirs:
        if d and os.path.isabs(d) and os.path.realpath(d) != cwd and d not in out:
            out.append(d)
    return out


def _candidates() -> list[str]:
    out: list[str] = []
    env = os.environ.get("WORKBENCH_BLAS")
    if env:
        out.append(env)
    for base in _site_dirs():
        if os.path.isdir(os.path.join(base, "cmeel.prefix")):
            out += sorted(glob.glob(os.path.join(base, "cmeel.prefix", "lib", "libopenblas.so*")))[:1]
    for pat in (
        "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/*-linux-gnu/openblas-openmp/libopenblas.so.0",
        "/usr/lib/*-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas*.so.0",
        "/usr/lib/libopenblas.so.0",
    ):
        out += sorted(glob.glob(pat))
    out.append("libopenblas.so.0")
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


def ensure_fast_blas() -> dict:
    """Load OpenBLAS globally if we are on Linux and mlx.core is not yet imported."""
    if STATUS["loaded"] is not None or STATUS["reason"] is not None:
        return STATUS
    if not sys.platform.startswith("linux"):
        STATUS["reason"] = "not Linux: MLX uses its platform BLAS"
        return STATUS
    if os.environ.get("WORKBENCH_BLAS", "").lower() in ("off", "0", "none"):
        STATUS["reason"] = "disabled by WORKBENCH_BLAS=off"
        return STATUS
    if "mlx.core" in sys.modules:
        STATUS["reason"] = (
            "mlx.core was imported before workbench, so MLX keeps the slow reference BLAS "
            "(~30x slower matmuls on CPU); import workbench first"
        )
        warnings.warn("workbench: " + STATUS["reason"], RuntimeWarning, stacklevel=3)
        return STATUS
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.isabs(path):  # never a file found from the working directory
            errors.append(f"{path}: a relative path (give WORKBENCH_BLAS an absolute one)")
            continue
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        STATUS["loaded"] = path
        STATUS["tried"] = errors
        return STATUS
    STATUS["tried"] = errors
    STATUS["reason"] = (
        "no OpenBLAS could be loaded, so MLX runs on the slow reference BLAS (~30x slower "
        "matmuls); install one: `apt-get install libopenblas0-pthread` (Debian/Ubuntu) or "
        "`pip install cmeel-openblas` with libgfortran5, or set WORKBENCH_BLAS=/path/to/libopenblas.so"
    )
    warnings.warn("workbench: " + STATUS["reason"], RuntimeWarning, stacklevel=3)
    return STATUS
