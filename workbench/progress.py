"""A progress bar for slow runs (a streamed model reading its layers from disk), on
``tqdm.auto``: a widget bar in a notebook, one rewritten line on stderr in a terminal.

    bar = progress.start(total=35, label="segments", enabled=None)   # None when not shown
    bar.update(done=5, detail="layers.4")
    bar.close()

``enabled``: True (always; on stderr when not in a notebook), False (never) or None
(automatic: in a notebook kernel, or when stderr is a terminal; never under pytest's
captured stderr).  The bar appears only once a run has taken ``delay`` seconds (tqdm's
``delay=``), so fast runs print nothing; it is redrawn when the caller updates it (at
segment ends).
"""
from __future__ import annotations

import sys

#: seconds a run must have taken before the bar appears
DELAY = 1.0
#: what the line shows: "segments: 5/35, layers.4 00:12" (the detail is tqdm's postfix)
FORMAT = "{desc}: {n_fmt}/{total_fmt}{postfix} {elapsed}"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (ipykernel's shell)."""
    ip = sys.modules.get("IPython")
    if ip is None or "ipykernel" not in sys.modules:
        return False
    try:
        shell = ip.get_ipython()
    except Exception:  # noqa: BLE001 - no shell: not a notebook
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def start(total: int, label: str, enabled: bool | None = None, delay: float | None = None):
    """A :class:`Bar` (or None when ``enabled`` rules it out); ``delay`` default :data:`DELAY`."""
    if enabled is False:
        return None
    if enabled is None and not (in_notebook() or _stderr_is_tty()):
        return None
    return Bar(total, label, DELAY if delay is None else delay)


class Bar:
    """``update(done, detail)`` with the absolute count done (tqdm counts increments)."""

    def __init__(self, total: int, label: str, delay: float):
        from tqdm.auto import tqdm

        self.total = max(int(total), 1)
        self._tqdm = tqdm(total=self.total, desc=label, delay=delay, file=sys.stderr, bar_format=FORMAT,
                          mininterval=0.25, leave=True)

    def update(self, done: int, detail: str = "") -> None:
        self._tqdm.set_postfix_str(detail, refresh=False)
        self._tqdm.update(min(int(done), self.total) - self._tqdm.n)

    def close(self) -> None:
        """The last state is drawn only if the bar was shown (a fast run prints nothing)."""
        self._tqdm.close()
