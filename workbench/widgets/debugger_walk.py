"""The StepDebugger's walk (workbench/widgets/debugger.py): what each button does to the
Trace -- step, start, back, step over layer, run to an op, next non-finite -- through its
public API (``step``, ``run``, ``back``, ``reset``, ``first_nonfinite``) and
:mod:`workbench.trace.navigate`, a chunk of ops at a time with progress, saying each action
in the log.  Also the Python API: ``dbg.step()``, ``dbg.run_to("layers.1")`` ...

The debugger supplies the widgets this reads (``trace``, ``output``, ``progress``,
``target_hint``, the buttons) and ``refresh()``, which redraws after each action."""
from __future__ import annotations

import html
import time

from workbench.trace.navigate import NoSuchOp, find_op, next_boundary
from workbench.widgets._render import fmt, shape_str

CHUNK = 48  # ops per evaluation while running (the progress bar moves between chunks)


class DebuggerWalk:
    """The buttons' actions of :class:`~workbench.widgets.debugger.StepDebugger`."""

    def _say(self, text: str) -> None:
        self.output.append_stdout(text.rstrip("\n") + "\n")

    def _busy(self, on: bool) -> None:
        for btn in (self.start_button, self.back_button, self.step_button, self.layer_button,
                    self.nonfinite_button, self.end_button, self.run_to_button):
            btn.disabled = on
        if not on:
            tr = self.trace
            self.step_button.disabled = self.layer_button.disabled = self.end_button.disabled = tr.done
            self.nonfinite_button.disabled = self.run_to_button.disabled = tr.done
            self.back_button.disabled = self.start_button.disabled = tr.position == 0

    # ------------------------------------------------------------------ actions (also the Python API)
    def step(self):
        """Run the next op (the step button)."""
        if self.trace.done:
            self._say("the trace is done: every op ran (use back)")
            return None
        t0 = time.perf_counter()
        s = self.trace.step()
        self._say(f"step → op #{s.index} {s.name} {shape_str(s.output_shape)}"
                  + (f" absmax {fmt(s.stats['absmax'], '.4g')}" if s.stats else ""))
        self.refresh()
        self.last_update_s = time.perf_counter() - t0
        return s

    def start(self):
        """Back to the start: no op run, nothing captured (the start button)."""
        if self.trace.position == 0:
            self._say("already at the start")
            return None
        n = self.trace.position
        self.trace.reset()
        self._say(f"start: undid {n} ops: next op #0 {self.trace.ops[0]}")
        self.refresh()
        return None

    def back(self):
        """Undo the last op (the back button)."""
        if self.trace.position == 0:
            self._say("at the start: nothing to undo")
            return None
        i = self.trace.position - 1
        name = self.trace.ops[i]
        s = self.trace.back()
        self._say(f"back ← undid op #{i} {name}")
        self.refresh()
        return s

    def step_layer(self):
        """Run to the next layer boundary (:func:`~workbench.trace.navigate.next_boundary`):
        the end of the embedding ops, of the current layer (``layers.{i}``), or the last op."""
        tr = self.trace
        if tr.done:
            self._say("the trace is done")
            return None
        end = next_boundary(tr.program, tr.position)
        return self._run(end, stop_nonfinite=False, label=f"step over layer to {tr.ops[end]}")

    def run_to(self, name: str | None):
        """Run through the op named exactly ``name`` (None: to the end), a chunk at a time with
        progress.  A name that is no op runs nothing: the closest names are suggested."""
        tr = self.trace
        self.target_hint.value = ""
        if name is not None:
            try:
                end = find_op(tr.ops, name)
            except NoSuchOp as e:
                why = ("type an op name (or pick one from the list)" if not e.name.strip() else str(e))
                self._say(f"run to: {why}; nothing ran")
                self.target_hint.value = f"<span style='color:#a40'>run to: {html.escape(why)}</span>"
                return None
        if tr.done:
            self._say("the trace is done")
            return None
        if name is not None:
            if end < tr.position:
                self._say(f"{tr.ops[end]} (op #{end}) already ran; the next op is #{tr.position}: use back")
                return None
        else:
            end = len(tr.ops) - 1
        return self._run(end, stop_nonfinite=False, label=f"run to {tr.ops[end]}")

    def next_nonfinite(self):
        """Run until an op's output holds a NaN or an infinity; explain the first such op."""
        tr = self.trace
        if tr.done:
            self._say("the trace is done")
            return None
        s = self._run(len(tr.ops) - 1, stop_nonfinite=True, label="run to the next non-finite value")
        if s is not None and s.nonfinite:
            f = tr.first_nonfinite()
            if f is not None:
                self._say(f"first non-finite value of this forward pass: {f}")
        elif tr.done:
            self._say("no NaN or Inf anywhere: the forward pass is clean")
        return s

    def _run(self, end: int, stop_nonfinite: bool, label: str):
        from workbench.trace import NONFINITE

        tr = self.trace
        self._busy(True)
        t0 = time.perf_counter()
        start = tr.position
        saved = list(tr.breakpoints)
        if stop_nonfinite:
            tr.breakpoints[:] = [NONFINITE]
        last = None
        try:
            while tr.position <= end:
                stop = min(end, tr.position + CHUNK - 1)
                s = tr.run(until=tr.ops[stop])
                last = s or last
                self.progress.value = tr.position
                if s is not None and (s.index < stop or (stop_nonfinite and s.nonfinite)):
                    break  # a breakpoint hit
        finally:
            tr.breakpoints[:] = saved
            self._busy(False)
        ran = tr.position - start
        why = ""
        if last is not None and last.index < end:
            why = " (stopped: non-finite output)" if last.nonfinite else " (stopped at a breakpoint)"
        self._say(f"{label}: {ran} ops in {time.perf_counter() - t0:.2f} s{why}"
                  + (f" → op #{last.index} {last.name}" if last is not None else ""))
        self.refresh()
        return last
