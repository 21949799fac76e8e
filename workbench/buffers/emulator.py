"""The engine emulator: run an op program the way a GPU engine does, on a fixed pool of
named scratch buffers, and record the dispatch schedule.

A :class:`Plan` says where every value lives (buffer and byte offset).  The
:class:`Emulator` runs each op as one "dispatch": it reads the op's inputs from the
bytes of their slots, computes the op with its real MLX function, and writes the result
into the op's slot.  The default plan gives each op role (``self_attn.o_proj``,
``input_layernorm``, ...) a scratch buffer that is reused from layer to layer once its
previous value is dead, like an engine's temporaries; it is hazard-free and reproduces
the reference logits bit for bit.

Edit the plan to alias, and the emulator does what a GPU kernel does: a dispatch whose
output bytes overlap one of its inputs computes **tile by tile**, writing each output
tile before reading the inputs for the next one, so later tiles see clobbered input;
a value overwritten before its last reader is simply gone.  The numbers go wrong (or
NaN), deterministically, while :func:`~workbench.buffers.analyze` names the dispatch.

Invariants:

1. every program input and every op output has exactly one slot; slots of values alive
   at the same time never overlap in the default plan;
2. a dispatch reads its inputs only from their slots (never from a Python-side copy),
   and writes only its own slot; weights are immutable and live outside the pool;
3. scratch bytes start as 0xFF (NaN for floats) and program inputs are written by the
   host before the first dispatch (their buffers are ``initialized``);
   a dispatch whose integer or boolean input (token ids, masks, expert indices) is not
   bit-identical to the reference is not run (a GPU would index out of bounds; MLX would
   crash) and writes 0xFF bytes (NaN) instead;
4. in concurrent mode, the dispatches of one region (between barriers) all read memory
   as it was at the region's start, and their writes land, in order, at its end;
5. the recorded schedule (serial, or concurrent with barriers; one command buffer unless
   ``commit_after`` splits it) lists, per dispatch, reads of
   ``in0``, ``in1``, ... labelled with the input's name and a write of ``out`` labelled
   with the op's name; kernels are op kinds, and element-wise kinds declare their
   (input, out) pairs in-place, because tile-by-tile is exact for them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import mlx.core as mx

from workbench.buffers.analyze import Hazard, analyze
from workbench.buffers.ranges import RangeMap
from workbench.buffers.schedule import Access, Buffer, Event, Schedule
from workbench.dtypes import bf16_to_f32
from workbench.program import Program, execute

#: op kinds whose kernels may write over these inputs (element-wise: exact tile by tile)
DEFAULT_INPLACE: dict[str, list[tuple[str, str]]] = {
    "add": [("in0", "out"), ("in1", "out")],
    "scale": [("in0", "out")],
    "glu": [("in0", "out"), ("in1", "out")],
    "softcap": [("in0", "out")],
}

POISON = 0xFF

_NP = {mx.float32: np.float32, mx.float16: np.float16, mx.int32: np.int32, mx.int64: np.int64,
       mx.uint32: np.uint32, mx.uint8: np.uint8, mx.int8: np.int8, mx.int16: np.int16,
       mx.uint16: np.uint16, mx.uint64: np.uint64, mx.bool_: np.bool_, mx.bfloat16: np.uint16}


def _np_dtype(dt: mx.Dtype):
    try:
        return _NP[dt]
    except KeyError:
        raise TypeError(f"the emulator cannot hold {dt} values in a byte buffer") from None


def _to_bytes(a: mx.array) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.ascontiguousarray(np.array(a)).reshape(-1).view(np.uint8)


def _from_bytes(raw: np.ndarray, shape: tuple, dt: mx.Dtype) -> mx.array:
    arr = raw.view(_np_dtype(dt)).reshape(shape)
    a = mx.array(arr)
    return a.view(mx.bfloat16) if dt == mx.bfloat16 else a


def _host(raw: np.ndarray, shape: tuple, dt: mx.Dtype) -> np.ndarray:
    """Bytes of a value as a numpy array (bfloat16 widened to float32, bit-exactly)."""
    if dt == mx.bfloat16:
        return bf16_to_f32(raw.view(np.uint16)).reshape(shape)
    return raw.view(_np_dtype(dt)).reshape(shape)


def role_of(name: str) -> str:
    """The scratch role of a value: ``layers.3.self_attn.q_proj`` -> ``self_attn.q_proj``;
    ``layers.3`` -> ``residual``; top-level names stay as they are."""
    m = re.fullmatch(r"layers\.\d+(?:\.(.*))?", name)
    if m:
        return m.group(1) or "residual"
    return name


@dataclass(frozen=True)
class Slot:
    buffer: str
    offset: int = 0


@dataclass
class Plan:
    """Where each value lives.  Edit with :meth:`place` / :meth:`resize` (both return a new plan)."""

    slots: dict[str, Slot]
    nbytes: dict[str, int]
    inputs: tuple[str, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)  # explicit buffer sizes (else: fitted)

    def __getitem__(self, name: str) -> Slot:
        return self.slots[self._known(name)]

    def _known(self, name: str) -> str:
        if name not in self.slots:
            near = get_close_matches(name, list(self.slots), n=3)
            hint = f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
            raise KeyError(f"no value named {name!r} in this plan{hint}")
        return name

    def place(self, name: str, buffer: str | None = None, offset: int = 0, *, like: str | None = None) -> "Plan":
        """Put value ``name`` at ``buffer``/``offset``, or in the very slot of value ``like``.

        ``plan.place("layers.1.self_attn.o_proj", like="layers.1.self_attn.context")``
        makes o_proj write over its own input; ``plan.place(..., buffer="attnH")`` gives it
        a scratch buffer of its own (created and sized to fit).
        """
        self._known(name)
        if like is not None:
            if buffer is not None:
                raise ValueError("give either buffer= or like=, not both")
            slot = self[like]
        else:
            if not isinstance(buffer, str) or not buffer:
                raise ValueError("buffer must be a non-empty string")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
            slot = Slot(buffer, offset)
        slots = dict(self.slots)
        slots[name] = slot
        return Plan(slots, self.nbytes, self.inputs, dict(self.sizes))

    def resize(self, buffer: str, size: int) -> "Plan":
        """Declare ``buffer`` as ``size`` bytes (accesses past it become out-of-bounds)."""
        sizes = dict(self.sizes)
        sizes[buffer] = int(size)
        return Plan(dict(self.slots), self.nbytes, self.inputs, sizes)

    def fitted(self) -> dict[str, int]:
        """Bytes each buffer needs to hold every value placed in it."""
        need: dict[str, int] = {}
        for n, s in self.slots.items():
            need[s.buffer] = max(need.get(s.buffer, 0), s.offset + self.nbytes[n])
        return need

    def buffers(self) -> dict[str, int]:
        """Declared size of every buffer (explicit sizes win over fitted ones)."""
        need = self.fitted()
        return {b: self.sizes.get(b, n) for b, n in need.items()}

    def values_in(self, buffer: str) -> list[str]:
        return [n for n, s in self.slots.items() if s.buffer == buffer]

    def table(self) -> str:
        sizes = self.buffers()
        lines = []
        for b in sizes:
            vals = self.values_in(b)
            shown = ", ".join(vals[:4]) + (f", ... ({len(vals)} values)" if len(vals) > 4 else "")
            lines.append(f"{b:32s} {sizes[b]:>10d} B  {shown}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Plan: {len(self.slots)} values in {len(self.fitted())} buffers>"


@dataclass
class EmulatorRun:
    """One emulated forward pass: the plan, the recorded schedule, the numbers."""

    plan: Plan
    schedule: Schedule
    logits: np.ndarray                  # read back from the logits slot after the last dispatch
    outputs: dict[str, np.ndarray]      # each op's output as its dispatch wrote it
    reference: dict[str, np.ndarray]    # each op's reference output (program.execute)
    # (numpy arrays in the value's dtype; bfloat16 values widened to float32 bit-exactly)
    last_op: str
    _hazards: list[Hazard] | None = None

    @property
    def hazards(self) -> list[Hazard]:
        if self._hazards is None:
            self._hazards = analyze(self.schedule)
        return self._hazards

    @property
    def reference_logits(self) -> np.ndarray:
        return self.reference[self.last_op]

    @property
    def exact(self) -> bool:
        """Logits bit-identical to the reference."""
        a, b = self.logits, self.reference_logits
        return a.shape == b.shape and a.tobytes() == b.tobytes()

    def first_divergence(self) -> str | None:
        """The first op (in program order) whose dispatch wrote different bytes than the reference."""
        for name, out in self.outputs.items():
            ref = self.reference[name]
            if out.shape != ref.shape or out.tobytes() != ref.tobytes():
                return name
        return None

    def dispatch_of(self, op: str) -> int:
        """Event index of the dispatch that ran ``op``."""
        for i, e in enumerate(self.schedule.events):
            if e.type == "dispatch" and e.name == op:
                return i
        raise KeyError(f"no dispatch named {op!r}")

    def summary(self) -> str:
        lg = self.logits.astype(np.float64)
        ref = self.reference_logits.astype(np.float64)
        nan = int(np.isnan(lg).sum())
        diff = float(np.nanmax(np.abs(lg - ref))) if lg.shape == ref.shape and np.isfinite(lg).any() else float("nan")
        state = "exact" if self.exact else f"WRONG (max |diff| {diff:.3g}, {nan} NaN)"
        hz = f"{len(self.hazards)} hazard(s)" if self.hazards else "no hazards"
        fd = self.first_divergence()
        return f"logits {state}; {hz}" + (f"; first wrong op: {fd}" if fd else "")


def _as_np(a: mx.array) -> np.ndarray:
    return _host(_to_bytes(a).copy(), tuple(a.shape), a.dtype)


class Emulator:
    """Emulate an engine running ``program`` on a buffer pool, for one fixed input.

    ``Emulator(model, ids)`` with a workbench model (``workbench.load``) -- add
    ``cache=`` (a KV cache filled by an earlier forward) to emulate a decode step -- or
    ``Emulator(program, context=ctx_or_factory, feeds={...})`` for a hand-written
    :class:`~workbench.program.Program`.  ``tiles`` sets how many output tiles per row
    a kernel that aliases its input writes one after another (default 4).
    """

    def __init__(self, model_or_program: Any, ids: Any = None, *, context: Any = None,
                 feeds: Mapping[str, mx.array] | None = None, dtype: Any = None,
                 inplace: Mapping[str, list[tuple[str, str]]] | None = None, tiles: int = 4,
                 cache: Any = None):
        if hasattr(model_or_program, "program") and hasattr(model_or_program, "feeds"):
            model = model_or_program
            self.program: Program = model.program
            # with a KV cache (a decode step after a prefill), every run continues from the
            # same cached positions: cache ops write after ``cache.start``, so re-running is harmless
            self._make_ctx: Callable[[], Any] = lambda: model.context(dtype, cache)
            if feeds is None:
                if ids is None:
                    raise ValueError("give the token ids to run: Emulator(model, ids)")
                feeds = model.feeds(ids, cache=cache) if cache is not None else model.feeds(ids)
        else:
            self.program = model_or_program
            if not isinstance(self.program, Program):
                raise TypeError("expected a workbench model or a Program")
            if feeds is None:
                raise ValueError("a bare Program needs feeds={input name: mx.array}")
            self._make_ctx = context if callable(context) else (lambda: context)
        missing = [n for n in self.program.inputs if n not in feeds]
        if missing:
            raise ValueError(f"feeds lack program input(s) {', '.join(missing)}")
        self.feeds = {n: feeds[n] for n in self.program.inputs}
        self.inplace = dict(DEFAULT_INPLACE if inplace is None else inplace)
        self.tiles = max(1, int(tiles))
        # reference pass: every value, evaluated; gives shapes, dtypes, byte sizes
        ref = execute(self.program, self._make_ctx(), self.feeds, keep=lambda n: True)
        mx.eval(list(ref.values()))
        self.shapes: dict[str, tuple[tuple, mx.Dtype]] = {}
        for n, v in self.feeds.items():
            self.shapes[n] = (tuple(v.shape), v.dtype)
        for op in self.program.ops:
            v = ref[op.name]
            self.shapes[op.name] = (tuple(v.shape), v.dtype)
        self.reference = {op.name: _as_np(ref[op.name]) for op in self.program.ops}
        # integer / boolean values (token ids, masks, expert indices) are only used as they
        # were in the reference: garbage indices would make MLX read out of bounds
        self._index_like = {n for n, (_, dt) in self.shapes.items()
                            if not mx.issubdtype(dt, mx.floating)}
        self._ref_bytes = {n: _to_bytes(self.feeds[n] if n in self.feeds else ref[n]).tobytes()
                           for n in self._index_like}
        self.nbytes = {n: int(np.prod(s, dtype=np.int64)) * np.dtype(_np_dtype(dt)).itemsize
                       for n, (s, dt) in self.shapes.items()}

    # ------------------------------------------------------------------ plans

    def plan(self) -> Plan:
        """The default, hazard-free plan: one buffer per program input; per op role a
        scratch buffer reused across layers once its previous value is dead (a second
        instance ``role#1`` ... when it is still alive)."""
        prog = self.program
        last = prog.last_use()
        end = len(prog.ops)
        slots: dict[str, Slot] = {n: Slot(n, 0) for n in prog.inputs}
        busy: dict[str, list[int]] = {}  # role -> per instance: index of the last reader of its value
        for i, op in enumerate(prog.ops):
            role = role_of(op.name)
            until = last.get(op.name, i)
            if i == end - 1:
                until = end
            inst = busy.setdefault(role, [])
            for k, b in enumerate(inst):
                if b < i:
                    inst[k] = until
                    break
            else:
                k = len(inst)
                inst.append(until)
            slots[op.name] = Slot(role if k == 0 else f"{role}#{k}", 0)
        return Plan(slots, dict(self.nbytes), tuple(prog.inputs))

    # ------------------------------------------------------------------ running

    def run(self, plan: Plan | None = None, *, mode: str = "serial", barriers: str = "auto",
            skip_barriers: Sequence[str] = (), commit_after: Sequence[str] = (),
            reuse_committed: bool = False) -> EmulatorRun:
        """Run every op as a dispatch on the plan's buffers; record the schedule.

        mode: "serial", or "concurrent" (dispatches between barriers may overlap, as with a
        Metal concurrent encoder) with ``barriers`` "auto" (a barrier exactly where a
        dispatch touches bytes the current region writes, or writes bytes it reads -- the
        way ggml-metal places them), "none", or "all" (after every dispatch).  Within a
        region every dispatch reads memory as it was when the region began and the writes
        land at its end (one legal GPU interleaving), so a missing barrier shows in the
        numbers: a reader gets the previous contents (scratch starts as NaN).
        skip_barriers: op names before which the "auto" barrier is left out (a forgotten
        ``memoryBarrier``): the op reads what its region's earlier dispatches have not yet
        written.
        commit_after: op names after which the command buffer is committed and a new one
        begun; ``reuse_committed=True`` keeps encoding into the committed one instead (the
        crash from the seed reports).
        """
        if mode not in ("serial", "concurrent"):
            raise ValueError(f"mode must be 'serial' or 'concurrent', got {mode!r}")
        if barriers not in ("auto", "none", "all"):
            raise ValueError(f"barriers must be 'auto', 'none' or 'all', got {barriers!r}")
        commits, skips = set(commit_after), set(skip_barriers)
        for arg, names in (("commit_after", commits), ("skip_barriers", skips)):
            unknown = sorted(n for n in names if n not in self.program)
            if unknown:
                near = get_close_matches(unknown[0], self.program.names, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise KeyError(f"{arg} names no op {unknown[0]!r}{hint}")
        plan = plan if plan is not None else self.plan()
        prog = self.program
        for n in list(self.feeds) + prog.names:
            if n not in plan.slots:
                raise ValueError(f"the plan has no slot for {n!r}")
        declared = plan.buffers()
        fitted = plan.fitted()
        pool = {b: np.full(max(declared[b], fitted[b]), POISON, np.uint8) for b in declared}
        input_bufs = {plan.slots[n].buffer for n in self.feeds}
        # the host writes the inputs
        for n, v in self.feeds.items():
            s = plan.slots[n]
            raw = _to_bytes(v)
            pool[s.buffer][s.offset: s.offset + raw.size] = raw

        ctx = self._make_ctx()

        def compute(op, view: Mapping[str, np.ndarray]) -> np.ndarray:
            """Output bytes of one run of the op's kernel on the buffer contents ``view``."""
            args = []
            for src in op.inputs:
                s = plan.slots[src]
                raw = view[s.buffer][s.offset: s.offset + self.nbytes[src]].copy()
                if src in self._index_like and raw.tobytes() != self._ref_bytes[src]:
                    # clobbered token ids / masks / indices: a GPU kernel would index out of
                    # bounds; the emulator does not run it and writes garbage (0xFF) instead
                    return np.full(self.nbytes[op.name], POISON, np.uint8)
                shape, dt = self.shapes[src]
                args.append(_from_bytes(raw, shape, dt))
            return _to_bytes(op.fn(ctx, *args))

        events: list[Event] = []
        outputs: dict[str, np.ndarray] = {}
        cb = 0
        region_r: dict[str, RangeMap] = {}
        region_w: dict[str, RangeMap] = {}
        # writes of the current concurrent region land when it ends: every dispatch of a
        # region reads memory as it was at the region's start (one legal GPU interleaving)
        pending: list[tuple[str, int, np.ndarray]] = []

        def end_region() -> None:
            nonlocal region_r, region_w
            for b, off, raw in pending:
                pool[b][off: off + raw.size] = raw
            pending.clear()
            region_r, region_w = {}, {}

        for op in prog.ops:
            out_slot = plan.slots[op.name]
            n_out = self.nbytes[op.name]
            o0, o1 = out_slot.offset, out_slot.offset + n_out
            reads = []
            aliased = False
            for k, src in enumerate(op.inputs):
                s = plan.slots[src]
                reads.append(Access(f"in{k}", s.buffer, s.offset, self.nbytes[src], src))
                if s.buffer == out_slot.buffer and s.offset < o1 and o0 < s.offset + self.nbytes[src]:
                    aliased = True
            writes = [Access("out", out_slot.buffer, o0, n_out, op.name)]
            if mode == "concurrent" and barriers == "auto" and events and events[-1].type == "dispatch":
                clash = any(region_w.get(a.buffer) is not None and region_w[a.buffer].any_overlap(a.offset, a.end)
                            for a in reads)
                clash = clash or any(m.get(a.buffer) is not None and m[a.buffer].any_overlap(a.offset, a.end)
                                     for a in writes for m in (region_r, region_w))
                if clash and op.name not in skips:
                    events.append(Event("barrier"))
                    end_region()
            events.append(Event("dispatch", name=op.name, kernel=op.kind, cb=cb, reads=reads, writes=writes))
            # run the kernel on memory as this region sees it
            if not aliased:
                raw = compute(op, pool)
            else:
                own = pool[out_slot.buffer].copy()     # the kernel sees its own tiles land
                view = dict(pool)
                view[out_slot.buffer] = own
                self._tiled(op, lambda o: compute(o, view), own, o0, n_out)
                raw = own[o0:o1].copy()
            pending.append((out_slot.buffer, o0, raw))
            shape, dt = self.shapes[op.name]
            outputs[op.name] = _host(raw.copy(), shape, dt)
            if mode == "concurrent":
                for accs, m in ((reads, region_r), (writes, region_w)):
                    for a in accs:
                        m.setdefault(a.buffer, RangeMap()).assign(a.offset, a.end, 1)
                if barriers == "all":
                    events.append(Event("barrier"))
                    end_region()
            else:
                end_region()
            if op.name in commits:
                end_region()
                events.append(Event("commit", cb=cb))
                events.append(Event("complete", cb=cb))
                if not reuse_committed:
                    cb += 1
        end_region()
        if prog.ops[-1].name not in commits:
            events.append(Event("commit", cb=cb))
            events.append(Event("complete", cb=cb))
        used = {e.kernel for e in events if e.type == "dispatch"}
        sch = Schedule(mode=mode,
                       buffers={b: Buffer(declared[b], b in input_bufs) for b in declared},
                       kernels={k: list(v) for k, v in self.inplace.items() if k in used},
                       events=events)
        last = prog.ops[-1].name
        shape, dt = self.shapes[last]
        s = plan.slots[last]
        logits = _host(pool[s.buffer][s.offset: s.offset + self.nbytes[last]].copy(), shape, dt)
        return EmulatorRun(plan, sch, logits, outputs, self.reference, last)

    def _tiled(self, op, compute, dest: np.ndarray, o0: int, n_out: int) -> None:
        """A kernel whose output overlaps an input: write tile t, then read inputs for tile t+1."""
        shape, dt = self.shapes[op.name]
        item = np.dtype(_np_dtype(dt)).itemsize
        elems = n_out // item if item else 0
        if elems == 0:
            return
        row = shape[-1] if shape else 1
        tile = max(1, row // self.tiles, -(-elems // 256))  # at most 256 tiles per dispatch
        for t0 in range(0, elems, tile):
            t1 = min(elems, t0 + tile)
            raw = compute(op)
            dest[o0 + t0 * item: o0 + t1 * item] = raw[t0 * item: t1 * item]
