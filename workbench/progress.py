"""A progress bar for slow runs (a streamed model reading its layers from disk): an
ipywidgets bar in a notebook, one rewritten line on stderr in a terminal.

    bar = progress.start(total=35, label="trace", enabled=None)   # None when not shown
    bar.update(done=5, detail="layers.4")                         # stores the state
    bar.close()

``enabled``: True (always; on stderr when not in a notebook), False (never) or None
(automatic: in a notebook kernel, or when stderr is a terminal; never under pytest's
captured stderr).  The bar appears only once a run has taken ``delay`` seconds, so fast
runs print nothing; the caller updates its state at segment ends (a store, no drawing)
and a daemon thread redraws it, so the elapsed time moves while a slow layer runs.
"""
from __future__ import annotations

import sys
import threading
import time

#: seconds a run must have taken before the bar appears
DELAY = 1.0
#: seconds between redraws
_REDRAW = 0.25


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
    notebook = in_notebook()
    if enabled is None and not (notebook or _stderr_is_tty()):
        return None
    return Bar(total, label, notebook, DELAY if delay is None else delay)


class Bar:
    """Redrawn by a small daemon thread (every ``_REDRAW`` seconds once ``delay`` has
    passed), so the elapsed time moves while one slow layer runs; :meth:`update` only
    stores the state."""

    def __init__(self, total: int, label: str, notebook: bool, delay: float):
        self.total = max(int(total), 1)
        self.label = label
        self.notebook = notebook
        self.delay = delay
        self.t0 = time.monotonic()
        self.shown = False
        self._widgets = None
        self._done = 0
        self._detail = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="workbench-progress", daemon=True)
        self._thread.start()

    def update(self, done: int, detail: str = "") -> None:
        self._done, self._detail = done, detail

    def _tick(self) -> None:
        if self._stop.wait(self.delay):
            return
        while not self._stop.is_set():
            self._draw()
            self._stop.wait(_REDRAW)

    def _text(self) -> str:
        return f"{self.label}: {self._done}/{self.total} {self._detail} {time.monotonic() - self.t0:.1f} s"

    def _draw(self, final: bool = False) -> None:
        with self._lock:
            self.shown = True
            if self.notebook:
                if self._widgets is None:
                    import ipywidgets as W
                    from IPython.display import display

                    self._widgets = (W.IntProgress(min=0, max=self.total), W.Label())
                    display(W.HBox(list(self._widgets)))
                bar, text = self._widgets
                bar.value = min(self._done, self.total)
                text.value = self._text()
                if final:
                    bar.bar_style = "success"
                return
            width = 30
            fill = int(width * min(self._done, self.total) / self.total)
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self._text()}\x1b[K")
            if final:
                sys.stderr.write("\n")
            sys.stderr.flush()

    def close(self) -> None:
        """Stop redrawing; the last state is drawn only if the bar was shown (a fast run
        prints nothing)."""
        self._stop.set()
        self._thread.join()
        if self.shown:
            self._draw(final=True)
