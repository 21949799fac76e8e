"""workbench: see inside transformer language models while they run (on MLX)."""
from workbench import _blas

_blas.ensure_fast_blas()  # must run before anything imports mlx.core

__version__ = "0.1.0"


def blas_status() -> dict:
    """Which BLAS MLX uses on this machine (Linux CPU), and why."""
    return dict(_blas.STATUS)


def load(path, dtype=None):
    """Open a checkpoint as a runnable model (see workbench.models.load)."""
    from workbench.models import load as _load

    return _load(path, dtype=dtype)
