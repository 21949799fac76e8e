"""The crash hunt: which op (or module call) kills the process, and what it was given.

    result = workbench.crash_hunt("path/to/checkpoint", "the cat sat", dtype="bfloat16")
    result.found, result.finding.op, result.finding.signal, result.finding.causes
    workbench hunt PATH --prompt TEXT --crash [--timeout S] [--json]

A process that dies (SIGFPE inside a kernel, SIGSEGV, an MLX abort) takes its trace with
it.  So the forward runs in a child process (``python -m workbench.trace.crash_child``:
:mod:`workbench.trace.crash_child`; this module is the parent's side), one step
of the Trace at a time (``tr.step()``: an op of the op program, or a module call at module
granularity), each evaluated and synchronized (``mx.synchronize()``) before the next.
Before a step runs, the child writes to the parent, one JSON line each over a pipe of its
own (not stdout, which libraries print to).  The child runs only our code and dies with the
parent (:mod:`workbench.child`: ``python -I`` with this process's import path less the
working directory, started in ``/``, in a process group of its own that a hang or the
parent's exit kills whole, and a parent-death signal), so a ``json.py`` or ``workbench/``
lying in the user's folder is never imported:

* ``{"event": "step", "index", "name", "kind", "layer", "inputs": [{name, shape, dtype, size}]}``;
* ``{"event": "output", "index", "shape", "dtype", "size", "nbytes", "memory_free"}``: the
  step's output as MLX's lazy graph shapes it, built but not yet run;
* ``{"event": "done", "index"}`` once it ran and the device is synchronized;

and ``start``, ``stage``, ``error`` and ``end`` around them.  When the child dies the last
step it announced and did not finish is the one that killed it: the parent reports it, the
shapes, dtypes and element counts it read and made, how the child ended (the signal by
name, or the exit code, or the exception a step raised) and a suggested cause where one is
known (:func:`suggest`).  A step (or the child's start) running past ``timeout`` seconds is
a hang: the parent kills the child (by its process id) and reports the step.  The parent
reads with a deadline and drops a line the child did not finish writing, so a child dying
mid-message cannot hang it.  No pickle: plain JSON lines.

Testing aid: the child reads the environment variable ``WORKBENCH_CRASH_AT`` =
``NAME[:HOW]`` (:data:`CRASH_AT_ENV`), and every report made while it is set says so
(``report["planted"]``, the finding's first suggested cause, the CLI's first line), so a
variable left in a shell never passes for a real crash: at the first step whose
name matches ``NAME`` (exact, a glob or ``re:...``), after announcing it and before running
it, the child kills itself: ``HOW`` is a signal name (``FPE``, the default, ``SEGV``,
``BUS``, ``ILL``, ``KILL``, ``TERM``), ``abort`` (``os.abort()``: SIGABRT, as an MLX abort),
``exit`` or ``exit=N`` (a non-zero exit), ``raise`` (an exception in the step), ``hang``
(sleeps: the timeout's finding) or ``torn`` (half a message, then SIGKILL).
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from workbench import child as _child_process
from workbench.trace.crash_child import CRASH_AT_ENV, MODULE as CHILD_MODULE

#: seconds one step (or the child's start: loading the checkpoint) may take before it is a hang
DEFAULT_TIMEOUT = 600.0
#: element counts past which 32-bit indexing breaks (signed / unsigned)
INT32_ELEMENTS = 2**31
UINT32_ELEMENTS = 2**32

_MAX_LINE = 4 * 2**20  # a longer line from the child is dropped (a module call's many inputs fit)
_STDERR_TAIL = 2000


# ============================================================================ the report

@dataclass
class CrashFinding:
    """Where and how the child died.

    ``op``, ``index``, ``kind``, ``layer``: the step it died in (None when it died before
    the first step: while loading or recording); ``stage``: ``"load"``, ``"trace"`` (making
    the trace: a module-level model records its forward), ``"build"`` (building the step's
    graph), ``"run"`` (running and synchronizing it), ``"between steps"`` or ``"exit"``;
    ``inputs``: ``[{name, shape, dtype, size}]``; ``output``: ``{shape, dtype, size, nbytes}``
    (None when it died before the graph was built); ``signal`` (``"SIGFPE"``) or
    ``exit_code`` or ``error`` (an exception the step raised); ``hung`` with ``timeout``;
    ``causes``: suggested causes; ``stderr``: the end of what the child printed; ``planted``:
    the value of ``WORKBENCH_CRASH_AT`` when it was set (the testing aid: not a real crash)."""

    op: str | None
    index: int | None
    kind: str | None
    layer: int | None
    stage: str
    inputs: list = field(default_factory=list)
    output: dict | None = None
    signal: str | None = None
    exit_code: int | None = None
    error: str | None = None
    hung: bool = False
    timeout: float | None = None
    causes: list = field(default_factory=list)
    memory_free: int | None = None
    stderr: str = ""
    planted: str | None = None

    @property
    def how(self) -> str:
        """How the child ended, in words: 'SIGFPE', 'exit code 3', 'hung (over 5 s)', 'raised ...'."""
        if self.hung:
            return f"hung (no progress in {self.timeout:g} s)"
        if self.error is not None:
            return f"raised {self.error}"
        if self.signal is not None:
            return self.signal
        if self.exit_code == 0:
            return "exit code 0 before the forward finished"
        return f"exit code {self.exit_code}"

    def to_dict(self) -> dict:
        return {"op": self.op, "index": self.index, "kind": self.kind, "layer": self.layer, "stage": self.stage,
                "inputs": self.inputs, "output": self.output, "signal": self.signal, "exit_code": self.exit_code,
                "error": self.error, "hung": self.hung, "timeout": self.timeout, "causes": self.causes,
                "memory_free": self.memory_free, "stderr": self.stderr, "planted": self.planted}

    def __str__(self) -> str:
        where = (f"{self.op} ({'' if self.layer is None else f'layer {self.layer}, '}{self.kind}, step {self.index})"
                 if self.op is not None else f"no step ({self.stage})")
        return f"{where}: {self.how}" + (f"; {self.causes[0]}" if self.causes else "")

    def __repr__(self) -> str:
        return f"<CrashFinding {self}>"


@dataclass
class CrashResult:
    """``report``: the JSON of ``workbench hunt --crash``; ``finding``: a
    :class:`CrashFinding`, or None when the forward completed; ``messages``: every message
    the child sent (plain dicts)."""

    report: dict
    finding: CrashFinding | None
    messages: list = field(default_factory=list, repr=False)

    @property
    def found(self) -> bool:
        return self.finding is not None

    def __str__(self) -> str:
        r = self.report
        note = f" [{CRASH_AT_ENV}={r['planted']} is set: planted]" if r.get("planted") else ""
        if self.finding is None:
            return (f"no crash: {r['steps_completed']} of {r['steps']} steps ran, each synchronized "
                    f"({r['granularity']}, {r['device']}){note}")
        return f"crash at {self.finding} ({r['steps_completed']} of {r['steps']} steps completed){note}"

    def __repr__(self) -> str:
        return f"<CrashResult {self}>"


def _fmt_bytes(n: int) -> str:
    from workbench.sizes import fmt_bytes

    return fmt_bytes(n)


def _count_note(what: str, shape, size: int) -> str | None:
    if size >= UINT32_ELEMENTS:
        return (f"{what} {list(shape)} has {size} elements, at or past 2^32: a 32-bit element count or "
                f"index wraps (MLX's CUDA backend dies with SIGFPE on lm_head's [16384, 262144] logits, "
                f"2^32 elements; fewer positions, or logits for the positions needed, avoid it)")
    if size >= INT32_ELEMENTS:
        return (f"{what} {list(shape)} has {size} elements, at or past 2^31: a signed 32-bit element "
                f"count or index overflows in a kernel")
    return None


def suggest(finding: CrashFinding) -> list[str]:
    """Causes known to kill a process at a step like this one, most likely first: an element
    count at or past 2^32 / 2^31 (the output's, then each input's), an output larger than the
    memory free when the step began (workbench.device_memory), SIGKILL (the kernel's
    out-of-memory killer), an allocation error raised by MLX."""
    out = []
    o = finding.output
    if o is not None:
        note = _count_note("the output", o["shape"], o["size"])
        if note:
            out.append(note)
    for d in finding.inputs:
        note = _count_note(f"input {d['name']}", d["shape"], d["size"])
        if note:
            out.append(note)
    free = finding.memory_free
    if o is not None and free is not None and o.get("nbytes") is not None and o["nbytes"] > free:
        out.append(f"an allocation beyond free memory: the output needs {_fmt_bytes(o['nbytes'])}, "
                   f"{_fmt_bytes(free)} was free when the step began (workbench/device_memory.py)")
    if finding.signal == "SIGKILL" and not finding.hung:
        out.append("SIGKILL from outside the process: most often the kernel's out-of-memory killer "
                   "(see dmesg)")
    err = (finding.error or "").lower()
    if finding.error is not None and ("alloc" in err or "out of memory" in err):
        out.append("an allocation failed: the step asks for more memory than the device has free")
    return out


# ============================================================================ the parent

def _jsonable_ids(ids_or_text):
    """Text, ids or a batch of either, as plain JSON values (what the child's trace takes)."""
    x = ids_or_text
    if hasattr(x, "tolist") and not isinstance(x, (str, list, tuple)):
        x = x.tolist()  # (an mx.array or numpy array of ids: its integers, checked by the child)
    if isinstance(x, tuple):
        x = list(x)
    if isinstance(x, list):
        x = [e.tolist() if hasattr(e, "tolist") and not isinstance(e, (str, list, tuple, int)) else e for e in x]
    try:
        json.dumps(x, allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(f"crash_hunt: cannot send {type(ids_or_text).__name__} to the child: pass text, "
                        "token ids, or a list of either") from None
    return x


def _model_spec(model_or_path, granularity, library, memory_budget, dtype):
    """(path, granularity, library, memory_budget, dtype) for the child, from a path or an
    opened model (reopened there from its path)."""
    if isinstance(model_or_path, (str, os.PathLike)):
        return os.path.abspath(os.fspath(model_or_path)), granularity, library, memory_budget, dtype
    path = getattr(model_or_path, "path", None)
    if path is None:
        raise TypeError("crash_hunt: pass a checkpoint path or a model opened by workbench.load (the child "
                        f"reopens it from its path), not {type(model_or_path).__name__}")
    if granularity == "auto":
        granularity = model_or_path.granularity
    if library is None:
        library = getattr(model_or_path, "library", None) if granularity == "module" else None
    if memory_budget is None and getattr(model_or_path, "release_weights", None) is not None:
        memory_budget = getattr(model_or_path, "memory_budget", None)
    if dtype is None:
        import mlx.core as mx

        d = getattr(model_or_path, "dtype", None)
        if isinstance(d, mx.Dtype) and d != getattr(model_or_path, "default_dtype", d):
            from workbench.dtypes import dtype_name

            dtype = dtype_name(d)
    return os.path.abspath(os.fspath(path)), granularity, library, memory_budget, dtype


def _logits_spec(logits):
    """``logits=`` as JSON for the child: a name, a list of positions, or a slice's bounds."""
    if logits is None or isinstance(logits, str):
        return logits
    if isinstance(logits, slice):
        return {"slice": [logits.start, logits.stop, logits.step]}
    if isinstance(logits, (list, tuple)):
        return list(logits)
    raise TypeError(f"logits must be 'all', 'last', a slice or a list of positions, not {type(logits).__name__}")


def crash_hunt(model_or_path, ids_or_text, dtype=None, *, granularity: str = "auto", library: str | None = None,
               attention=None, memory_budget=None, timeout: float | None = DEFAULT_TIMEOUT,
               python: str | None = None, logits=None) -> CrashResult:
    """Run the forward in a child process, one synchronized step at a time, and report the
    step that killed it (:class:`CrashResult`; ``found`` False when the forward completed).

    ``model_or_path``: a checkpoint path, or a model from :func:`workbench.load` (the child
    reopens its path at its granularity).  ``ids_or_text``, ``dtype``, ``attention``: as
    :func:`workbench.trace` takes them (``attention`` at op level only).  ``granularity``,
    ``library``, ``memory_budget``: as :func:`workbench.load` takes them.  ``timeout``: seconds
    one step (or the child's start) may take before it counts as a hang (None: no limit).
    Input the child cannot use (an unreadable checkpoint, a prompt without a tokenizer, an
    id out of range) is a ValueError naming it, as in a plain trace.  ``python``: the
    interpreter the child runs under (default: this one).  ``logits``: the positions whose
    logits the head computes, as :func:`workbench.trace` takes them (default: its default,
    which keeps only the last position past the logits budget: ``"all"`` reproduces a crash
    in a head over every position)."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
    if not isinstance(granularity, str) or granularity not in ("auto", "op", "module"):
        raise ValueError(f"granularity must be one of auto, op, module, not {granularity!r}")
    path, granularity, library, memory_budget, dtype = _model_spec(model_or_path, granularity, library,
                                                                   memory_budget, dtype)
    spec = {"path": path, "granularity": granularity, "library": library, "dtype": dtype,
            "attention": attention, "memory_budget": memory_budget, "ids_or_text": _jsonable_ids(ids_or_text),
            "logits": _logits_spec(logits)}
    try:
        payload = json.dumps(spec, allow_nan=False).encode()
    except (TypeError, ValueError):
        raise TypeError("crash_hunt: attention and memory_budget must be plain values (str, int, list)") from None
    planted = os.environ.get(CRASH_AT_ENV, "").strip() or None  # (the child gets this environment)
    t0 = time.perf_counter()
    messages, ended, rc, hung_after, torn, stderr, stepping = _run_child(payload, timeout, python)
    seconds = time.perf_counter() - t0
    result = _result(messages, ended, rc, hung_after, torn, stderr, timeout, seconds, planted)
    result.report["stepping_seconds"] = None if stepping is None else round(stepping, 3)
    return result


def _run_child(payload: bytes, timeout, python: str | None):
    """Start the child (isolated: :mod:`workbench.child`), feed it ``payload``, read its
    messages until it ends (or hangs); the child's process group is killed on the way out.
    Returns (messages, saw_end, returncode, hung, torn_bytes, stderr_tail, seconds from the
    child's ``start`` to its last message: the stepping, without Python's start or the load)."""
    r, w = os.pipe()
    err = tempfile.TemporaryFile()
    request = tempfile.TemporaryFile()  # (its stdin: a file, so a long prompt never blocks the parent)
    proc = None
    try:
        request.write(payload)
        request.seek(0)
        argv = _child_process.python_argv(CHILD_MODULE, "--child", str(w), "--parent", str(os.getpid()),
                                          python=python)
        try:
            proc = subprocess.Popen(argv, stdin=request, stdout=err, stderr=err, pass_fds=(w,),
                                    **_child_process.popen_options())
        finally:
            os.close(w)  # (the child holds the only write end: its death is our EOF)
        messages, buf, hung, ended = [], b"", False, False
        deadline = None if timeout is None else time.monotonic() + timeout
        exited_at = started = last = None
        while True:
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            ready, _, _ = select.select([r], [], [], wait)
            if ready:
                data = os.read(r, 1 << 16)
                if not data:
                    break  # EOF: the child (and anything it started) closed the pipe
                buf += data
                *lines, buf = buf.split(b"\n")
                if len(buf) > _MAX_LINE:
                    buf = b""
                for line in lines:
                    try:
                        m = json.loads(line)
                    except ValueError:
                        continue  # (not ours, or garbled: ignored)
                    if not isinstance(m, dict):
                        continue
                    messages.append(m)
                    last = time.monotonic()
                    if m.get("event") == "start":
                        started = last
                    if m.get("event") in ("stage", "step") and timeout is not None:
                        deadline = time.monotonic() + timeout  # (each step has its own limit)
                    ended = ended or m.get("event") == "end"
                continue
            if proc.poll() is not None:  # exited, yet the pipe is open: a process it started holds it
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > 2.0:
                    break
            if deadline is not None and time.monotonic() >= deadline and proc.poll() is None:
                hung = True
                _child_process.kill_group(proc)  # (our own child and whatever it started)
                break
        try:
            rc = proc.wait(timeout=None if timeout is None else max(timeout, 5.0))
        except subprocess.TimeoutExpired:  # EOF but still running: it closed the pipe and hangs
            hung = True
            _child_process.kill_group(proc)
            rc = proc.wait()
        err.seek(0, os.SEEK_END)
        size = err.tell()
        err.seek(max(0, size - _STDERR_TAIL))
        tail = err.read().decode("utf-8", "replace")
        stepping = None if started is None else last - started
        return messages, ended, rc, hung, len(buf), tail.strip(), stepping
    finally:
        if proc is not None:  # (whatever ended us here: nothing of the child's outlives the hunt)
            _child_process.kill_group(proc)
            if proc.poll() is None:
                proc.wait()
        os.close(r)
        err.close()
        request.close()


_INPUT_STAGES = ("spec", "load", "trace")


def _result(messages, ended, rc, hung, torn, stderr, timeout, seconds, planted=None) -> CrashResult:
    start = next((m for m in messages if m.get("event") == "start"), {})
    errors = [m for m in messages if m.get("event") == "error"]
    if errors and errors[-1].get("stage") in _INPUT_STAGES and not hung:
        raise ValueError(errors[-1].get("message") or "the child could not open its input")
    completed = sum(1 for m in messages if m.get("event") == "done")
    report = {"crash": None, "steps_completed": completed, "steps": start.get("steps"),
              "granularity": start.get("granularity"), "device": start.get("device"),
              "dtype": start.get("dtype"), "tokens": start.get("tokens"), "seconds": round(seconds, 3),
              "planted": planted}
    if ended and rc == 0 and not hung:
        return CrashResult(report, None, messages)

    # the last step announced and not finished is the one it died in
    step = out = None
    done = set()
    stage = next((m.get("stage") for m in reversed(messages) if m.get("event") == "stage"), "start")
    for m in messages:
        ev = m.get("event")
        if ev == "step":
            step, out = m, None
        elif ev == "output" and step is not None and m.get("index") == step.get("index"):
            out = m
        elif ev == "done":
            done.add(m.get("index"))
    if step is not None and step.get("index") in done:
        stage = "exit" if ended else "between steps"
    elif step is not None:
        stage = "run" if out is not None else "build"
    error = errors[-1].get("message") if errors else None
    f = CrashFinding(op=step.get("name") if step else None, index=step.get("index") if step else None,
                     kind=step.get("kind") if step else None, layer=step.get("layer") if step else None,
                     stage=stage, inputs=list(step.get("inputs") or []) if step else [],
                     output=({k: out.get(k) for k in ("shape", "dtype", "size", "nbytes")} if out else None),
                     memory_free=out.get("memory_free") if out else None,
                     hung=hung, timeout=timeout if hung else None, error=error, stderr=stderr, planted=planted)
    if not hung:
        if rc < 0:
            try:
                f.signal = signal.Signals(-rc).name
            except ValueError:
                f.signal = f"signal {-rc}"
        else:
            f.exit_code = rc
    f.causes = suggest(f)
    if planted:
        f.causes.insert(0, f"planted by {CRASH_AT_ENV}={planted} (a testing aid, set in this environment: "
                           "not the model's crash; unset it)")
    if torn:
        f.causes.append(f"(the child died in the middle of a message: {torn} bytes of it dropped)")
    report["crash"] = f.to_dict()
    return CrashResult(report, f, messages)
