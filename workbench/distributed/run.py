"""A trace split by layers across processes: :func:`trace_distributed`.

Every rank opens the same checkpoint and builds the same op program, takes its share of
the layers (:mod:`workbench.distributed.plan`) and steps only those ops in a
:class:`~workbench.trace.tracer.Trace` of its own (a sub-program whose inputs are the
program's inputs and the values the rank before sent).  Rank 0 makes the token ids and
runs first; each rank then sends rank + 1 the ids and every value a later rank reads
(:mod:`workbench.distributed.wire`).  At the end every rank's step records (JSON) are
gathered to rank 0 in rank order, which is program order, and the last rank sends the
logits to rank 0.  A rank reads only the checkpoint tensors its own ops use: the reader
maps the files lazily and MLX reads a tensor's bytes when an op evaluates it.
"""
from __future__ import annotations

import json
import socket
import time

import mlx.core as mx

from workbench.distributed.plan import Plan, make_plan
from workbench.distributed.wire import WireError, gather_bytes, recv_bundle, send_bundle
from workbench.device_memory import NotEnoughMemory
from workbench.dtypes import dtype_name
from workbench.errors import UsageError
from workbench.models.streaming import preflight
from workbench.trace.entry import check_attention_memory, prepare_ids
from workbench.trace.interventions import normalize as normalize_interventions
from workbench.trace.step import Step, TraceError, headroom_rows
from workbench.trace.tracer import Trace


class DistributedTrace:
    """What rank 0 gets back: every rank's steps in program order, the logits, and what each
    rank ran (``ranks``: rank, host, layers, ops, tensors read, seconds stepping, seconds
    waiting for the rank before, bytes sent to the rank after, peak resident bytes).

    The values themselves stay on the rank that computed them; ``steps`` carry the
    statistics (the capture setting's, as in a one-process trace)."""

    def __init__(self, program, steps: list[Step], logits: mx.array, ranks: list[dict], dtype,
                 batched: bool, ids: mx.array, plan: Plan):
        self.program = program
        self._steps = steps
        self._by_name = {s.name: s for s in steps}
        self.logits = logits
        self.ranks = ranks
        self.dtype = dtype
        self.batched = batched
        self.ids = ids
        self.plan = plan
        self.position = len(steps)

    def __repr__(self) -> str:
        parts = ", ".join(f"rank {r['rank']}: layers {r['layers'][0]}-{r['layers'][1]}" for r in self.ranks)
        return f"<DistributedTrace {len(self._steps)} ops over {len(self.ranks)} ranks ({parts}), {dtype_name(self.dtype)}>"

    @property
    def ops(self) -> list[str]:
        return self.program.names

    @property
    def done(self) -> bool:
        return self.position == len(self.program)

    @property
    def steps(self) -> list[Step]:
        return list(self._steps)

    def records(self) -> list[dict]:
        """One JSON-able dict per step, as :meth:`Trace.records` gives them."""
        return [s.to_dict() for s in self._steps]

    def step_info(self, name: str) -> Step:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no op named {name!r} in this trace (see .ops)") from None

    def stats(self, name: str) -> dict:
        st = self.step_info(name).stats
        if st is None:
            raise KeyError(f"op {name!r} has no statistics (the trace ran with capture=None)")
        return dict(st)

    def headroom(self, top: int | None = None) -> list[tuple[str, float]]:
        return headroom_rows(self._steps, top)


def _capture_for(capture, program, sub):
    """The rank's capture setting: the user's, except that name patterns matching none of
    this rank's ops become "stats" (statistics of every op, no values: what patterns mean
    for the ops they do not match)."""
    if capture is None or capture in ("none", "stats", "full"):
        return capture
    pats = [capture] if isinstance(capture, str) else list(capture)
    if not program.match(pats):
        raise UsageError(f"capture patterns {pats} match no op of this program")
    return pats if sub.match(pats) else "stats"


def _interventions_for(interventions, program, sub) -> list:
    """The interventions that apply to this rank's ops (each must match some op somewhere)."""
    ivs = normalize_interventions(interventions)
    for iv in ivs:
        if not program.match(iv.pattern):
            raise UsageError(f"intervention {iv.label!r} matches no op of this program")
    return [iv for iv in ivs if sub.match(iv.pattern)]


def _open(path, dtype):
    """The checkpoint (its tensor reads recorded) and the model at op granularity."""
    from workbench.checkpoint import open_checkpoint
    from workbench.models import load_model

    try:
        ck = open_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - any failure to open is unusable input, in one line
        raise UsageError(f"cannot open {path}: {_one_line(e)}") from None
    read: list[str] = []
    plain = ck.load

    def load_recorded(name):
        read.append(name)
        return plain(name)

    ck.load = load_recorded
    try:
        model = load_model(ck, dtype=dtype, granularity="op", preflight=False)  # (each rank checks its own layers)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot load {path} as an op program: {_one_line(e)}") from None
    return ck, model, read


def _peak_rss() -> int | None:
    """This process's peak resident memory in bytes (None where unknown)."""
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024
    except (ImportError, OSError):
        return None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().strip("'\"")
    return text.splitlines()[0] if text else type(e).__name__


def trace_distributed(path, prompt_or_ids, capture="stats", dtype=None, *, split=None, group=None,
                      pad_id: int | None = None, attention=None, interventions=None) -> DistributedTrace | None:
    """Trace the checkpoint at ``path`` split by layers over the processes of ``group``
    (default ``mx.distributed.init()``: the ranks ``mlx.launch`` started, or this process
    alone).

    Call it on every rank with the same arguments.  Rank 0 returns a
    :class:`DistributedTrace` (steps of every rank in program order, logits); the other
    ranks return None.  ``split``: layer counts per rank (default: balanced by the bytes
    of the tensors each rank reads).  ``capture``: "stats" | "full" | name patterns |
    None, applied on every rank (values stay on their rank).  ``attention``: as
    ``model.trace(run=Run(attention=...))``: None (the model's program, fused), "fused", "explicit"
    or the layers whose attention runs as explicit scores -> softmax -> context steps.
    ``interventions``: as ``model.trace(interventions=...)`` (workbench.trace.patch,
    zero_head ... or ``{pattern: fn}``); each rank applies those that match its ops, so
    every rank's script must define them alike.
    """
    group = group if group is not None else mx.distributed.init()
    rank, size = group.rank(), group.size()
    ck, model, read = _open(path, dtype)
    program = model.program
    if attention is not None:
        try:
            program = model.program_for(attention)
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"attention={attention!r}: {_one_line(e)}") from None
    plan = make_plan(program, size, split, {n: ck.info(n).nbytes for n in model.tensor_names})
    sub = plan.subprogram(rank)
    try:  # this rank holds its own layers' weights only: those are checked against its memory
        preflight(model, dtype, sub, what=f"rank {rank} (layers {plan.layers[rank][0]}-{plan.layers[rank][1]}): "
                                          "its weights need", advice="split the layers over more ranks or hosts")
    except NotEnoughMemory as e:
        raise UsageError(str(e)) from None
    cap = _capture_for(capture, program, sub)
    ivs = _interventions_for(interventions, program, sub)
    ctx = model.context(dtype)
    fingerprint = {"program": plan.fingerprint(), "dtype": dtype_name(ctx.dtype), "capture": repr(capture),
                   "size": size, "interventions": [iv.label for iv in normalize_interventions(interventions)]}
    waited = 0.0
    if rank == 0:
        ids, mask, batched = prepare_ids(model, prompt_or_ids, pad_id)
        received: dict = {}
    else:
        t = time.perf_counter()
        ids, mask, batched, received = _receive(rank, group, fingerprint)
        waited = time.perf_counter() - t
    start = time.perf_counter()
    feeds = dict(model.feeds(ids, attention_mask=mask))
    feeds.update(received)
    try:
        check_attention_memory(sub, int(ids.shape[0]), int(ids.shape[1]), int(ids.shape[1]), ctx.dtype)
        trace = Trace(sub, ctx, feeds, capture=cap, interventions=ivs,
                      context=lambda dt, cache: model.context(dt, cache=cache),
                      tensors=model.op_tensors, model=model, batched=batched, ids=ids, attention_mask=mask)
        sent = 0
        if rank < size - 1:
            out = _run_and_collect(trace, plan.sends[rank], received)
            out.update({"@ids": ids} if mask is None else {"@ids": ids, "@mask": mask})
            sent = send_bundle(out, dict(fingerprint, batched=batched), rank + 1, group)
        trace.run(wait=False)
        records = trace.records()
    except TraceError as e:
        raise UsageError(f"rank {rank}: {_one_line(e)}") from None
    for rec in records:
        rec["index"] = plan.ranks[rank][rec["index"]]
    part = {"rank": rank, "host": socket.gethostname(), "layers": list(plan.layers[rank]), "ops": len(sub),
            "tensors": sorted(set(read)), "seconds": round(time.perf_counter() - start, 4),
            "waited": round(waited, 4), "sent_bytes": sent, "peak_rss": _peak_rss(), "records": records}
    parts = _parts(gather_bytes(json.dumps(part).encode(), group), rank)
    if size > 1 and rank == size - 1:
        send_bundle({"logits": trace.logits}, {"rank": rank}, 0, group)
    if rank != 0:
        return None
    logits = trace.logits if size == 1 else recv_bundle(size - 1, group)[1]["logits"]
    return DistributedTrace(program, _in_program_order(parts), logits, parts, ctx.dtype, batched, ids, plan)


def _receive(rank: int, group, fingerprint: dict):
    """(ids, mask, batched, values) from the rank before, after checking it runs the same trace."""
    meta, received = recv_bundle(rank - 1, group)
    theirs = {k: meta.get(k) for k in fingerprint}
    if theirs != fingerprint:
        diff = ", ".join(f"{k} {theirs[k]!r} there, {fingerprint[k]!r} here"
                         for k in fingerprint if theirs[k] != fingerprint[k])
        raise UsageError(f"rank {rank} and rank {rank - 1} do not run the same trace ({diff}): "
                         "give every rank the same checkpoint, dtype, capture, attention, interventions and --layers")
    if "@ids" not in received:
        raise WireError(f"rank {rank - 1} sent no token ids")
    return received.pop("@ids"), received.pop("@mask", None), bool(meta.get("batched")), received


def _run_and_collect(trace: Trace, names: list[str], received: dict) -> dict:
    """Step ``trace`` through each of ``names`` this rank makes (in program order) and
    collect its value as it is made; names received from the rank before are forwarded."""
    out = {}
    for name in names:
        if name in received:
            out[name] = received[name]
        else:
            trace.run(until=name, wait=False)
            out[name] = trace.value(name)
    return out


def _parts(blobs: list[bytes], rank: int) -> list[dict]:
    """Every rank's part, checked: a rank that stopped leaves no readable part (MLX's ring
    backend may hand back zeros for it rather than raise)."""
    parts = []
    for r, b in enumerate(blobs):
        try:
            p = json.loads(b)
        except ValueError:
            p = None
        if not isinstance(p, dict) or p.get("rank") != r or not isinstance(p.get("records"), list):
            raise WireError(f"rank {rank}: rank {r}'s steps did not arrive (it stopped; its own message says why)")
        parts.append(p)
    return parts


def _in_program_order(parts: list[dict]) -> list[Step]:
    """Every rank's records (popped from ``parts``) as Steps, checked to be in program order."""
    steps, last = [], -1
    for p in parts:
        for rec in p.pop("records"):
            if rec["index"] <= last:
                raise WireError(f"rank {p['rank']} sent op {rec['name']!r} (index {rec['index']}) out of "
                                "program order")
            last = rec["index"]
            steps.append(Step.from_dict(rec))
    return steps
