"""How every widget runs its callbacks: on the thread that built it, errors shown in the widget.

The thread.  Since MLX 0.31.2 a stream belongs to the thread that created it, and a lazy
array is a graph node on the stream of the thread that made it.  A model's lazily loaded
weights (``mx.load``) and their dtype casts, a trace's feeds and the values it replays
lazily are such nodes, made on the thread that ran the notebook's cells (the kernel's main
thread).  JupyterLab sends widget messages to a kernel *subshell* (its setting
``commsOverSubshells``, default ``perCommTarget``) and ipykernel 7 handles each subshell on
a thread of its own, so a button's callback runs there; evaluating the main thread's
nodes from it raises ``RuntimeError: There is no Stream(cpu, 0) in current thread``.
:class:`Actions` therefore hands a callback that arrives on another thread to the event
loop of the thread that built the widget (``call_soon_threadsafe``): it runs there, in
the order the clicks came, as soon as that thread is idle (after the cell it is running,
if any).  Without an event loop (plain Python) callbacks run where they are called.

The errors.  An exception in a callback is shown in the widget's error area
(:attr:`Actions.area`: the action, the exception, the traceback folded away) and the view
is redrawn from its data object's state; nothing is left to the kernel's log.  The area also
carries ``data-actions``, the number of callbacks finished, so a browser test knows when
a click has been handled.
"""
from __future__ import annotations

import asyncio
import html
import threading
import traceback
from typing import Callable

import ipywidgets as W


class Actions:
    """Runs a widget's callbacks on the widget's thread; shows their errors in :attr:`area`.

    ``redraw`` (optional) is called after a callback that failed, so that the view shows its
    data object's state even when the action stopped half-way (a callback that works
    redraws what it changed itself)."""

    def __init__(self, redraw: Callable[[], None] | None = None):
        self.thread = threading.current_thread()
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:  # plain Python: no event loop to hand callbacks to
            self.loop = None
        self.redraw = redraw
        self.count = 0
        self.error: str | None = None
        self._depth = 0
        self.area = W.HTML()
        self.area.add_class("wb-error")
        self._show()

    def __call__(self, label: str, fn: Callable) -> Callable:
        """A callback for ipywidgets (``on_click``, ``observe``) running ``fn`` as :meth:`run` does."""
        def callback(*args):
            loop = self.loop
            if loop is not None and threading.current_thread() is not self.thread and not loop.is_closed():
                loop.call_soon_threadsafe(self.run, label, fn, *args)
            else:
                self.run(label, fn, *args)
        return callback

    def run(self, label: str, fn: Callable, *args) -> None:
        """Call ``fn(*args)`` now; an exception is shown in the error area and the view redrawn.

        A callback triggered by another one (a trait the first one sets) is a plain call:
        its error is the outer callback's error, and one click counts once."""
        if self._depth:
            fn(*args)
            return
        self.error = None
        self._depth += 1
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - every error is shown in the widget
            self.error = self._describe(label, e)
        finally:
            self._depth -= 1
        if self.error is not None and self.redraw is not None:
            try:
                self.redraw()
            except Exception as e:  # noqa: BLE001 - then the view may be stale: say so too
                self.error += "<br>" + self._describe("redrawing the view", e)
        self.count += 1
        self._show()

    @staticmethod
    def _describe(label: str, e: BaseException) -> str:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return (f"<b>{html.escape(label)} failed</b>: <code>{html.escape(type(e).__name__)}: "
                f"{html.escape(str(e))}</code><details><summary>traceback</summary>"
                f"<pre style='font-size:10px;white-space:pre-wrap'>{html.escape(tb)}</pre></details>")

    def _show(self) -> None:
        if self.error is None:
            self.area.value = f"<div class='wb-error-none' data-actions='{self.count}'></div>"
        else:
            self.area.value = (f"<div class='wb-error-shown' data-actions='{self.count}' style='border:1px solid "
                               f"#c00;background:#fff0f0;color:#600;padding:4px 6px;margin:4px 0'>"
                               f"{self.error}</div>")
