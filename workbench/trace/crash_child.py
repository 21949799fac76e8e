"""The crash hunt's child: one forward stepped a step at a time, each announced to the parent
before it runs (:mod:`workbench.trace.crash`, the parent's side, says what the messages are
and how a death is read from them).

Started as ``python -m workbench.trace.crash_child --child FD --parent PID`` (:data:`MODULE`,
isolated by :mod:`workbench.child`); it reads its request (JSON) on stdin and writes JSON
lines to the pipe ``FD``.  It also holds the testing aid ``WORKBENCH_CRASH_AT``
(:data:`CRASH_AT_ENV`: the step at which it kills itself, and how).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

from workbench import child as _child_process

#: the module name the parent starts (``python -m``)
MODULE = "workbench.trace.crash_child"
#: the testing aid read by the child only: ``NAME[:HOW]`` (see :mod:`workbench.trace.crash`)
CRASH_AT_ENV = "WORKBENCH_CRASH_AT"
PLANT_SIGNALS = ("FPE", "SEGV", "BUS", "ILL", "KILL", "TERM", "ABRT")
PLANT_OTHER = ("abort", "exit", "raise", "hang", "torn")
#: child exit codes: 3 unusable input (reported by an error message), 4 a step raised
EXIT_INPUT, EXIT_STEP = 3, 4


class _Pipe:
    """JSON lines to the parent, one ``os.write`` each (no buffering: a line sent is a line
    the parent has, whatever happens next)."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, **m) -> None:
        data = (json.dumps(m, allow_nan=False, default=str) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]


def _plant():
    """(pattern, how) from ``WORKBENCH_CRASH_AT``, or None."""
    spec = os.environ.get(CRASH_AT_ENV, "").strip()
    if not spec:
        return None
    name, sep, how = spec.rpartition(":")
    if not sep or not (how.upper() in PLANT_SIGNALS or how.split("=")[0] in PLANT_OTHER):
        name, how = spec, "FPE"
    return name, how


def _die(how: str, pipe: _Pipe) -> None:
    """The planted death (the testing aid of ``WORKBENCH_CRASH_AT``)."""
    if how == "abort":
        os.abort()
    if how.startswith("exit"):
        code = int(how.split("=", 1)[1]) if "=" in how else 1
        os._exit(code)
    if how == "raise":
        raise RuntimeError(f"planted by {CRASH_AT_ENV}")
    if how == "hang":
        while True:
            time.sleep(3600)
    if how == "torn":
        os.write(pipe.fd, b'{"event": "done", "ind')
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), getattr(signal, "SIG" + how.upper()))
    time.sleep(5)  # (a signal the process survives, then a plain exit)
    os._exit(1)


def _one_line(e: BaseException, typed: bool = False) -> str:
    """The first line of an exception's message (``typed``: after its type's name)."""
    text = str(e).strip().strip("'\"").strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return f"{type(e).__name__}: {line}" if typed and text else line


def _described(name: str, a) -> dict:
    from workbench.dtypes import dtype_name

    return {"name": name, "shape": list(a.shape), "dtype": dtype_name(a.dtype), "size": int(a.size)}


def _memory_free():
    """Bytes free for a new allocation now (device_memory's figure; less what MLX holds on a GPU
    with memory of its own), None where unknown."""
    import mlx.core as mx
    from workbench.device_memory import available_memory

    try:
        avail, _ = available_memory()
        if avail is not None and mx.default_device().type == mx.DeviceType.gpu:
            total = int(mx.device_info().get("total_memory") or 0)
            if total:  # (CUDA: MemAvailable does not see the device's memory in use)
                avail = min(avail, max(total - int(mx.get_active_memory()), 0))
        return avail
    except Exception:  # noqa: BLE001 - a figure only
        return None


def _child(fd: int) -> int:
    pipe = _Pipe(fd)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (a planted or real crash leaves no core file)
    except (ImportError, OSError, ValueError):
        pass
    pipe.send(event="stage", stage="spec", pid=os.getpid())
    try:
        spec = json.loads(sys.stdin.buffer.read())
    except ValueError as e:
        pipe.send(event="error", stage="spec", message=f"unreadable request: {e}")
        return EXIT_INPUT
    import mlx.core as mx

    from workbench.models import load

    pipe.send(event="stage", stage="load")
    try:
        model = load(spec["path"], granularity=spec["granularity"], library=spec["library"],
                     memory_budget=spec["memory_budget"])
    except Exception as e:  # noqa: BLE001 - unusable input, in one line
        pipe.send(event="error", stage="load", message=f"cannot load {spec['path']}: {_one_line(e)}")
        return EXIT_INPUT
    module = model.granularity == "module"
    src = spec["ids_or_text"]
    pipe.send(event="stage", stage="trace")
    try:
        if isinstance(src, str) and getattr(model, "tokenizer", None) is None and not module:
            why = getattr(getattr(model, "checkpoint", None), "tokenizer_error", None)
            raise ValueError(f"{spec['path']}: {why}; pass ids instead of text" if why else
                             f"{spec['path']} has no tokenizer.json: pass ids instead of text")
        kw = {}
        if spec["attention"] not in (None, "fused"):
            if module:
                raise ValueError("attention (--attention): a module-level model runs its own attention modules (no scores step)")
            from workbench.attention import parse_option

            att = spec["attention"]
            kw["run"] = {"attention": parse_option(att) if isinstance(att, str) else att}
        if spec.get("logits") is not None:
            lg = spec["logits"]
            kw["positions"] = {"logits": slice(*lg["slice"]) if isinstance(lg, dict) else lg}
        tr = model.trace(src, capture=None, dtype=spec["dtype"], **kw)
    except Exception as e:  # noqa: BLE001 - unusable input, in one line
        pipe.send(event="error", stage="trace", message=_one_line(e))
        return EXIT_INPUT
    ids = getattr(tr, "ids", None)
    from workbench.dtypes import dtype_name

    pipe.send(event="start", steps=len(tr.ops), granularity="module" if module else "op",
              device=str(mx.default_device().type).rsplit(".", 1)[-1],
              dtype=dtype_name(tr.dtype) if tr.dtype is not None else None,
              tokens=int(ids.shape[-1]) if ids is not None else None)
    plant = _plant()
    sync = getattr(mx, "synchronize", None)
    from workbench.program import name_matches

    ops = tr.program.ops
    for i, op in enumerate(ops):
        # what it reads: the module call's array arguments (its tape: nothing evaluated), or the
        # op's inputs, live in the trace (evaluated by the steps that made them)
        pairs = tr.inputs(op.name) if module else [(s, tr.value(s)) for s in op.inputs]
        pipe.send(event="step", index=i, name=op.name, kind=op.kind, layer=op.layer,
                  inputs=[_described(n, a) for n, a in pairs if isinstance(a, mx.array)])
        try:  # the output as the lazy graph shapes it (built, not run; the step builds its own)
            out = op.fn(tr.ctx, *[a for _, a in pairs]) if not module else op.fn(tr.ctx)
            pipe.send(event="output", index=i, shape=list(out.shape), dtype=dtype_name(out.dtype),
                      size=int(out.size), nbytes=int(out.nbytes), memory_free=_memory_free())
            del out
        except Exception:  # noqa: BLE001 - the step itself raises it again, named
            pass
        try:
            if plant is not None and name_matches(op.name, plant[0]):
                _die(plant[1], pipe)
            tr.step()
            if sync is not None:
                sync()
        except Exception as e:  # noqa: BLE001 - an MLX error raised in the step: a finding
            pipe.send(event="error", stage="run", index=i, message=_one_line(e, typed=True))
            return EXIT_STEP
        pipe.send(event="done", index=i)
    pipe.send(event="end", steps=len(ops))
    return 0


def _main(argv) -> int:
    if len(argv) != 4 or argv[0] != "--child" or argv[2] != "--parent" or not (argv[1].isdigit() and argv[3].isdigit()):
        print(f"{MODULE}: the crash hunt's child, started by crash_hunt() / workbench hunt --crash",
              file=sys.stderr)
        return 2
    _child_process.die_with_parent(int(argv[3]))
    fd = int(argv[1])
    try:
        return _child(fd)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
