"""The ``workbench.schedule/1`` format: a recorded stream of GPU dispatches and buffer events.

An engine writes this JSON while it encodes; :func:`load_schedule` reads and validates it,
and :func:`workbench.buffers.analyze` finds buffer hazards in it.  The full specification,
with a worked example and an emitting guide for Metal/CUDA engines, is docs/schedule.md.

Invariants a valid schedule satisfies (checked here, and nothing else is assumed later):

1. the top level is an object with ``"format": "workbench.schedule/1"``, ``"mode"`` one of
   ``"serial"`` / ``"concurrent"``, optional ``"buffers"``, ``"kernels"``, and ``"events"``
   (a list); keys starting with ``x-`` are extensions and are ignored everywhere, any
   other unknown key is an error (so a typo such as ``"offest"`` can't silently disable
   a check);
2. every byte count (``size``, ``offset``) is a JSON integer in [0, 2**62]; ``cb`` is an
   integer; booleans are not integers;
3. every event has a ``"type"`` among dispatch, barrier, alloc, free, commit, complete,
   and the fields its type requires (dispatch: ``name``; alloc/free: ``buffer``;
   commit/complete: ``cb``);
4. every buffer an event names is declared in ``"buffers"`` or allocated by an earlier
   ``alloc`` event (an alloc of an undeclared buffer must give its ``size``);
5. byte ranges are half-open ``[offset, offset + size)``; ``value`` labels are strings
   (``null`` or absent: unlabelled).

Whether a range fits its buffer, whether the buffer is still alive, whether a command
buffer is still open: those are hazards for the analyzer, not format errors.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from workbench.fsio import InputFileError, read_bytes
from workbench.nogc import no_gc

FORMAT = "workbench.schedule/1"
MODES = ("serial", "concurrent")
EVENT_TYPES = ("dispatch", "barrier", "alloc", "free", "commit", "complete")
MAX_BYTES = 2 ** 62
#: a schedule file larger than this is refused before reading (a 100k-event recording is 20-40 MB)
MAX_FILE_BYTES = 256 << 20

_EVENT_FIELDS = {
    "dispatch": {"type", "name", "kernel", "cb", "reads", "writes"},
    "barrier": {"type"},
    "alloc": {"type", "buffer", "size", "initialized"},
    "free": {"type", "buffer"},
    "commit": {"type", "cb"},
    "complete": {"type", "cb"},
}
_ACCESS_FIELDS = {"arg", "buffer", "offset", "size", "value"}
_TOP_FIELDS = {"format", "mode", "buffers", "kernels", "events"}


class ScheduleError(ValueError):
    """An unreadable or invalid schedule; the message names the event index and field."""

    def __init__(self, message: str, where: str = "", event: int | None = None):
        # a field name from the file may hold any character: keep the message on one line
        where = _printable(where)
        message = _printable(message)
        self.where = where
        self.event = event
        self.reason = message
        super().__init__(f"{where}: {message}" if where else message)


def _printable(text: str) -> str:
    """Escape control characters (newlines in a field name, say) so a message stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class Access:
    """One byte range a dispatch reads or writes."""

    __slots__ = ("arg", "buffer", "offset", "size", "value")

    def __init__(self, arg: str, buffer: str, offset: int, size: int, value: str | None = None):
        self.arg, self.buffer, self.offset, self.size, self.value = arg, buffer, offset, size, value

    @property
    def end(self) -> int:
        return self.offset + self.size

    def to_dict(self) -> dict:
        d = {"arg": self.arg, "buffer": self.buffer, "offset": self.offset, "size": self.size}
        if self.value is not None:
            d["value"] = self.value
        return d

    def __repr__(self) -> str:
        v = f" value={self.value!r}" if self.value is not None else ""
        return f"Access({self.arg}: {self.buffer}[{self.offset}:{self.end}]{v})"


class Event:
    """One event of the stream (fields not used by its type are None / empty)."""

    __slots__ = ("type", "name", "kernel", "cb", "reads", "writes", "buffer", "size", "initialized")

    def __init__(self, type: str, name: str | None = None, kernel: str | None = None,
                 cb: int | None = None, reads: list[Access] | None = None,
                 writes: list[Access] | None = None, buffer: str | None = None,
                 size: int | None = None, initialized: bool = False):
        self.type, self.name, self.kernel, self.cb = type, name, kernel, cb
        self.reads = reads if reads is not None else []
        self.writes = writes if writes is not None else []
        self.buffer, self.size, self.initialized = buffer, size, initialized

    def to_dict(self) -> dict:
        t = self.type
        if t == "dispatch":
            d: dict[str, Any] = {"type": t, "name": self.name}
            if self.kernel is not None:
                d["kernel"] = self.kernel
            if self.cb is not None:
                d["cb"] = self.cb
            d["reads"] = [a.to_dict() for a in self.reads]
            d["writes"] = [a.to_dict() for a in self.writes]
            return d
        if t == "alloc":
            d = {"type": t, "buffer": self.buffer, "size": self.size}
            if self.initialized:
                d["initialized"] = True
            return d
        if t == "free":
            return {"type": t, "buffer": self.buffer}
        if t in ("commit", "complete"):
            return {"type": t, "cb": self.cb}
        return {"type": t}

    def __repr__(self) -> str:
        return f"Event({self.to_dict()})"


@dataclass
class Buffer:
    size: int
    initialized: bool = False


@dataclass
class Schedule:
    """A validated schedule (build one with :func:`validate` or :func:`load_schedule`)."""

    mode: str
    buffers: dict[str, Buffer] = field(default_factory=dict)
    kernels: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    source: str | None = None

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "mode": self.mode,
            "buffers": {k: ({"size": b.size, "initialized": True} if b.initialized else {"size": b.size})
                        for k, b in self.buffers.items()},
            "kernels": {k: {"inplace": [list(p) for p in pairs]} for k, pairs in self.kernels.items()},
            "events": [e.to_dict() for e in self.events],
        }

    def save(self, path: str | os.PathLike) -> None:
        from workbench import fsio

        fsio.write_json(path, self.to_dict(), separators=(",", ":"))

    def dispatches(self) -> list[int]:
        return [i for i, e in enumerate(self.events) if e.type == "dispatch"]

    def describe(self, index: int) -> str:
        """``dispatch 12 'layers.0.self_attn.o_proj'`` / ``event 7 (barrier)``."""
        e = self.events[index]
        if e.type == "dispatch":
            return f"dispatch {index} {e.name!r}"
        return f"event {index} ({e.type})"


# --------------------------------------------------------------------------- validation

def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return _kind(v)
    s = json.dumps(v) if isinstance(v, (str, int, float, bool)) or v is None else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _nbytes(v: Any, where: str, event: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScheduleError(f"expected a byte count (a non-negative integer), got {_show(v)}", where, event)
    if v < 0:
        raise ScheduleError(f"expected a byte count (a non-negative integer), got {v}", where, event)
    if v > MAX_BYTES:
        raise ScheduleError(f"byte count {_show(v)} is beyond 2**62", where, event)
    return v


def _string(v: Any, where: str, event: int | None = None, empty_ok: bool = False) -> str:
    if not isinstance(v, str):
        raise ScheduleError(f"expected a string, got {_show(v)}", where, event)
    if not v and not empty_ok:
        raise ScheduleError("expected a non-empty string", where, event)
    return v


def _check_keys(d: dict, allowed: set, where: str, event: int | None = None) -> None:
    for k in d:
        if k not in allowed and not (isinstance(k, str) and k.startswith("x-")):
            exp = ", ".join(sorted(allowed))
            raise ScheduleError(f"unknown field {k!r} (expected {exp}; extensions start with 'x-')",
                                f"{where}.{k}" if where else k, event)


def _obj(v: Any, where: str, event: int | None = None) -> dict:
    if not isinstance(v, dict):
        raise ScheduleError(f"expected an object, got {_show(v)}", where, event)
    return v


def _fast_access(a: Any, known: set) -> Access | None:
    """The common, valid case without building error paths; None sends it to _slow_access."""
    if type(a) is not dict or not (a.keys() <= _ACCESS_FIELDS):
        return None
    buf = a.get("buffer")
    off = a.get("offset")
    sz = a.get("size")
    if not (type(buf) is str and buf in known and type(off) is int and type(sz) is int
            and 0 <= off <= MAX_BYTES and 0 <= sz <= MAX_BYTES):
        return None
    arg = a.get("arg")
    if arg is not None and not (type(arg) is str and arg):
        return None
    if arg is None and "arg" in a:
        return None
    value = a.get("value")
    if value is not None and type(value) is not str:
        return None
    return Access(arg, buf, off, sz, value)


def _slow_access(a: Any, aw: str, i: int, known: set) -> Access:
    a = _obj(a, aw, i)
    _check_keys(a, _ACCESS_FIELDS, aw, i)
    for req in ("buffer", "offset", "size"):
        if req not in a:
            raise ScheduleError(f'missing field "{req}"', f"{aw}.{req}", i)
    buf = _string(a["buffer"], aw + ".buffer", i)
    if buf not in known:
        raise ScheduleError(f"unknown buffer {buf!r} (declare it in \"buffers\" or allocate it "
                            f"with an earlier alloc event)", aw + ".buffer", i)
    arg = _string(a["arg"], aw + ".arg", i) if "arg" in a else None
    value = _string(a["value"], aw + ".value", i, empty_ok=True) if a.get("value") is not None else None
    return Access(arg, buf, _nbytes(a["offset"], aw + ".offset", i), _nbytes(a["size"], aw + ".size", i), value)


def validate(doc: Any, source: str | None = None) -> Schedule:
    """Check a parsed JSON document against the format; return a :class:`Schedule`.

    Raises :class:`ScheduleError` naming the first offending field, e.g.
    ``events[12].reads[0].offset (dispatch 'layers.0.self_attn.o_proj'): expected a
    byte count (a non-negative integer), got -4``.
    """
    doc = _obj(doc, "top level")
    _check_keys(doc, _TOP_FIELDS, "")
    if "format" not in doc:
        raise ScheduleError(f'missing field "format" (expected "{FORMAT}")', "format")
    if doc["format"] != FORMAT:
        raise ScheduleError(f"unsupported format {_show(doc['format'])} (this reader reads {FORMAT!r})", "format")
    if "mode" not in doc:
        raise ScheduleError('missing field "mode" ("serial" or "concurrent")', "mode")
    mode = doc["mode"]
    if mode not in MODES:
        raise ScheduleError(f'expected "serial" or "concurrent", got {_show(mode)}', "mode")

    buffers: dict[str, Buffer] = {}
    for bid, spec in _obj(doc.get("buffers", {}), "buffers").items():
        w = f"buffers[{json.dumps(bid)}]"
        if not bid:
            raise ScheduleError("buffer id must be a non-empty string", w)
        spec = _obj(spec, w)
        _check_keys(spec, {"size", "initialized"}, w)
        if "size" not in spec:
            raise ScheduleError('missing field "size" (bytes)', w + ".size")
        init = spec.get("initialized", False)
        if not isinstance(init, bool):
            raise ScheduleError(f"expected true or false, got {_show(init)}", w + ".initialized")
        buffers[bid] = Buffer(_nbytes(spec["size"], w + ".size"), init)

    kernels: dict[str, list[tuple[str, str]]] = {}
    for kname, spec in _obj(doc.get("kernels", {}), "kernels").items():
        w = f"kernels[{json.dumps(kname)}]"
        spec = _obj(spec, w)
        _check_keys(spec, {"inplace"}, w)
        pairs = spec.get("inplace", [])
        if not isinstance(pairs, list):
            raise ScheduleError(f"expected a list of [read arg, write arg] pairs, got {_show(pairs)}", w + ".inplace")
        out = []
        for j, p in enumerate(pairs):
            pw = f"{w}.inplace[{j}]"
            if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)):
                raise ScheduleError(f"expected a [read arg, write arg] pair of strings, got {_show(p)}", pw)
            out.append((p[0], p[1]))
        kernels[kname] = out

    if "events" not in doc:
        raise ScheduleError('missing field "events" (a list)', "events")
    raw = doc["events"]
    if not isinstance(raw, list):
        raise ScheduleError(f"expected a list, got {_show(raw)}", "events")

    known = set(buffers)
    events: list[Event] = []
    for i, ev in enumerate(raw):
        w = f"events[{i}]"
        if not isinstance(ev, dict):
            raise ScheduleError(f"expected an event object, got {_show(ev)}", w, i)
        t = ev.get("type")
        if not isinstance(t, str) or t not in _EVENT_FIELDS:
            if "type" not in ev:
                raise ScheduleError(f'missing field "type" (one of {", ".join(EVENT_TYPES)})', w + ".type", i)
            raise ScheduleError(f"unknown event type {_show(t)} (expected one of {', '.join(EVENT_TYPES)})", w + ".type", i)
        if t == "dispatch":
            if "name" not in ev:
                raise ScheduleError('missing field "name" (the op label)', w + ".name", i)
            name = _string(ev["name"], w + ".name", i)
            w = f"events[{i}]"
            tag = f" (dispatch {name!r})"
            try:
                _check_keys(ev, _EVENT_FIELDS[t], w, i)
                kernel = _string(ev["kernel"], w + ".kernel", i) if "kernel" in ev else None
                cb = ev.get("cb")
                if cb is not None and (isinstance(cb, bool) or not isinstance(cb, int)):
                    raise ScheduleError(f"expected a command-buffer id (an integer), got {_show(cb)}", w + ".cb", i)
                lists = []
                for key in ("reads", "writes"):
                    items = ev.get(key, [])
                    if not isinstance(items, list):
                        raise ScheduleError(f"expected a list of accesses, got {_show(items)}", f"{w}.{key}", i)
                    accs = []
                    for j, a in enumerate(items):
                        acc = _fast_access(a, known)
                        if acc is None:
                            acc = _slow_access(a, f"{w}.{key}[{j}]", i, known)
                        if acc.arg is None:
                            acc.arg = f"{key[:-1]}{j}"
                        accs.append(acc)
                    lists.append(accs)
            except ScheduleError as e:
                raise ScheduleError(e.reason, e.where + tag, i) from None
            events.append(Event("dispatch", name=name, kernel=kernel, cb=cb, reads=lists[0], writes=lists[1]))
            continue
        _check_keys(ev, _EVENT_FIELDS[t], w, i)
        if t == "barrier":
            events.append(Event("barrier"))
        elif t in ("commit", "complete"):
            if "cb" not in ev:
                raise ScheduleError('missing field "cb" (command-buffer id)', w + ".cb", i)
            cb = ev["cb"]
            if isinstance(cb, bool) or not isinstance(cb, int):
                raise ScheduleError(f"expected a command-buffer id (an integer), got {_show(cb)}", w + ".cb", i)
            events.append(Event(t, cb=cb))
        else:  # alloc / free
            if "buffer" not in ev:
                raise ScheduleError('missing field "buffer"', w + ".buffer", i)
            buf = _string(ev["buffer"], w + ".buffer", i)
            if t == "free":
                if buf not in known:
                    raise ScheduleError(f"free of unknown buffer {buf!r} (declare it in \"buffers\" or allocate it "
                                        f"with an earlier alloc event)", w + ".buffer", i)
                events.append(Event("free", buffer=buf))
            else:
                if "size" in ev:
                    size = _nbytes(ev["size"], w + ".size", i)
                elif buf in buffers:
                    size = buffers[buf].size
                else:
                    raise ScheduleError(f'missing field "size" (buffer {buf!r} is not declared in "buffers")',
                                        w + ".size", i)
                init = ev.get("initialized", False)
                if not isinstance(init, bool):
                    raise ScheduleError(f"expected true or false, got {_show(init)}", w + ".initialized", i)
                known.add(buf)
                events.append(Event("alloc", buffer=buf, size=size, initialized=init))
    return Schedule(mode=mode, buffers=buffers, kernels=kernels, events=events, source=source)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse(text: str | bytes, source: str | None = None) -> Schedule:
    """Parse and validate schedule JSON text."""
    with no_gc():
        return _parse(text, source)


def _parse(text: str | bytes, source: str | None) -> Schedule:
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ScheduleError("not a schedule: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ScheduleError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno} (char {e.pos})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ScheduleError(f"not valid JSON: {e}") from None
    try:
        return validate(doc, source)
    except RecursionError:
        raise ScheduleError("not a schedule: JSON nested too deeply") from None


def load_schedule(path: str | os.PathLike) -> Schedule:
    """Read and validate a ``workbench.schedule/1`` JSON file (never modifies it).

    Raises :class:`ScheduleError` (a ``ValueError``) with a message that starts with the
    path and names the event index and field at fault.
    """
    p = os.fspath(path)
    try:  # a regular file only (a FIFO or device is refused without blocking), size checked before reading
        data = read_bytes(p, MAX_FILE_BYTES)
    except InputFileError as e:
        raise ScheduleError(str(e)) from None
    try:
        return parse(data, source=p)
    except ScheduleError as e:
        raise ScheduleError(e.reason, f"{p}: {e.where}" if e.where else p, e.event) from None


def as_schedule(obj: Any) -> Schedule:
    """A :class:`Schedule` from a Schedule, a parsed dict, JSON text, or a path."""
    if isinstance(obj, Schedule):
        return obj
    if isinstance(obj, Mapping):
        return validate(dict(obj))
    if isinstance(obj, (str, os.PathLike)) and not (isinstance(obj, str) and obj.lstrip().startswith("{")):
        return load_schedule(obj)
    if isinstance(obj, (str, bytes)):
        return parse(obj)
    raise TypeError(f"expected a Schedule, a dict, JSON text or a path, got {type(obj).__name__}")
