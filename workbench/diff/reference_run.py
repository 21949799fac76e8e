"""Our side of the diff: run the reference on one input and keep its activations (:class:`Reference`), or dump them.

:func:`run_reference` runs the program's own uncaptured executor with a keep-set (TF32 off);
:func:`dump` writes the values as a float32 safetensors dump (streamed op by op for the CLI),
which :meth:`Reference.load` and :func:`is_reference_dump` read back.  :func:`load_model`,
:func:`ids_for` and :func:`program_of` are the steps ``workbench.diff.compare``
(workbench/diff/api.py, which re-exports this module's names) shares with them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from workbench.diff import readers
from workbench.diff.local import is_module_level
from workbench.diff.logit_rows import META_LOGITS, head_ops, parse_positions, positions_json
from workbench.diff.report import DiffError, to_numpy
from workbench.dtypes import dtype_name, parse_dtype

#: the dump metadata key of the matmul precision the values were computed under (workbench.precision)
META_PRECISION = "workbench.matmul_precision"


def _precision_of(used: str | None) -> str:
    """The label for a forward computed in dtype ``used`` (inside exact_float32)."""
    from workbench.precision import matmul_precision

    try:
        dt = parse_dtype(used) if used else None
    except ValueError:
        dt = None
    return matmul_precision(dt)


@dataclass
class Reference:
    """Our activations for one input: float32 arrays by op name, in execution order."""

    values: dict[str, np.ndarray]
    order: list[str]  # the whole program's execution order (values may hold a subset)
    ids: list[int] | None = None
    model: str | None = None
    dtype: str | None = None
    inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # each op's own dtype before the float32 dump
    #: what its float32 matmuls ran as: "float32", "tf32" (CUDA's default), "n/a (cpu)", "n/a (bfloat16)"
    matmul_precision: str | None = None
    #: the token positions its head tensors (``lm_head``, ``logits``: :func:`head_ops`) hold rows
    #: for, a ``range`` or tuple; None: every position (a dump from before logits=, or no ids)
    logit_positions: range | tuple | None = None
    #: one line when the default kept fewer than every position (the logits budget), else None
    logits_note: str | None = None

    @property
    def positions(self) -> range | tuple | None:
        """The positions of the head's rows (every one of the ids' when not recorded); None without ids."""
        if self.logit_positions is not None:
            return self.logit_positions
        return range(len(self.ids)) if self.ids else None

    def metadata(self) -> dict[str, str]:
        meta = {readers.META_MODEL: self.model or "", readers.META_DTYPE: self.dtype or "float32"}
        if self.ids is not None:
            meta[readers.META_IDS] = json.dumps([int(i) for i in self.ids])
        meta["workbench.op_inputs"] = json.dumps({k: list(v) for k, v in self.inputs.items()})
        meta["workbench.op_dtypes"] = json.dumps(self.dtypes)
        if self.matmul_precision:
            meta[META_PRECISION] = self.matmul_precision
        if self.logit_positions is not None:
            meta[META_LOGITS] = json.dumps(positions_json(self.logit_positions, len(self.ids or ())))
        return meta

    def save(self, path: str | os.PathLike) -> Path:
        readers.write_dump(path, self.values, self.order, self.metadata())
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Reference":
        values, meta = readers.read_safetensors(path)
        if meta.get(readers.META_FORMAT) != readers.FORMAT:
            raise readers.DumpError(f"{path}: not a workbench reference dump (no {readers.META_FORMAT} metadata)")
        order = readers.dump_order(meta) or list(values)
        ids = None
        if readers.META_IDS in meta:
            try:
                ids = json.loads(meta[readers.META_IDS])
            except json.JSONDecodeError:
                ids = None
            if not (isinstance(ids, list) and ids and all(type(i) is int and 0 <= i < 2**31 for i in ids)):
                raise readers.DumpError(f"{path}: metadata {readers.META_IDS} is not a list of token ids "
                                        f"({meta[readers.META_IDS][:60]!r})")
        try:
            inputs = {k: tuple(v) for k, v in json.loads(meta.get("workbench.op_inputs", "{}")).items()}
            dtypes = {str(k): str(v) for k, v in json.loads(meta.get("workbench.op_dtypes", "{}")).items()}
        except (json.JSONDecodeError, AttributeError):
            inputs, dtypes = {}, {}
        positions = parse_positions(meta, len(ids) if ids else None, path)
        return cls(values=values, order=order, ids=ids, model=meta.get(readers.META_MODEL) or None,
                   dtype=meta.get(readers.META_DTYPE), inputs=inputs, dtypes=dtypes,
                   matmul_precision=meta.get(META_PRECISION) or None, logit_positions=positions)


def is_reference_dump(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            n = int.from_bytes(head, "little")
            if n > 100_000_000:
                return False
            return readers.FORMAT.encode() in f.read(n)
    except OSError:
        return False


def load_model(model: Any, dtype: str | None):
    """The model the diff runs: a checkpoint path loaded (an op-level model with its explicit
    attention program, since engines dump their scores and softmax; what cannot be loaded is a
    DiffError), or a loaded model as it is (TypeError for anything else)."""
    if isinstance(model, (str, os.PathLike)):
        from workbench.checkpoint import CheckpointError
        from workbench.models import load

        if not os.path.exists(model):
            raise DiffError(f"{model}: no such file or directory")
        try:
            m = load(model, dtype=dtype)
            if not is_module_level(m):  # engines dump their scores and softmax: the reference has them
                m.program = m.program_for("explicit")
            return m
        except (CheckpointError, ValueError, KeyError, OSError) as e:
            msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
            raise DiffError(msg if str(model) in msg else f"{model}: {msg}") from None
    if not hasattr(model, "program") and getattr(model, "granularity", None) != "module":
        raise TypeError(f"expected a checkpoint path or a loaded model, not {type(model).__name__}")
    return model


def _forward(m, token_ids, names, dtype, logits=None):
    """(program, {name: lazy value} for ``names``, compute dtype name, the head's rows) of one
    forward: the op program's own uncaptured executor, or, for a module-level model, its
    recorded forward (a Trace without capture: the program exists only once the forward is
    recorded).  ``logits``: the positions the head computes (``trace``'s ``logits=``; None:
    its default); every tensor of :func:`head_ops` holds those rows."""
    import mlx.core as mx

    from workbench.program import execute
    from workbench.trace.entry import vocab_size
    from workbench.trace.logits import resolve

    ids = mx.array([list(token_ids)], dtype=mx.int32)
    if is_module_level(m):
        t = m.module_trace(ids, capture=None, dtype=dtype, logits=logits)
        t.run()
        wanted = set(t.program.names) if names is None else set(names)
        out = {n: t.value(n) for n in t.program.names if n in wanted}
        program, used, rows = t.program, dtype_name(t.dtype), t.logit_rows
    else:
        ctx = m.context(dtype)
        rows = resolve(logits, len(token_ids), 1, vocab_size(m), ctx.dtype)
        ctx.logit_rows = rows
        keep = set(m.program.names) if names is None else set(names)
        program, used = m.program, dtype_name(ctx.dtype)
        out = execute(program, ctx, m.feeds(ids), keep=keep.__contains__)
    if rows is not None and not rows.all:  # (a module's head may run on every row: its rows taken here)
        for n in head_ops(program.names):
            v = out.get(n)
            if v is not None and v.ndim >= 2 and v.shape[-2] == rows.T:
                out[n] = rows.select(v)
    return program, out, used, rows


def program_of(m, token_ids, dtype, logits=None):
    """The op program of ``m`` for these ids: its own, or a module-level model's as its forward records it."""
    return _forward(m, token_ids, (), dtype, logits)[0] if is_module_level(m) else m.program


def ids_for(model, prompt: str | None, ids: Sequence[int] | None) -> list[int]:
    """The token ids of exactly one of ``prompt`` (encoded by the model) or ``ids``, checked
    against the model's vocabulary (DiffError otherwise)."""
    if (prompt is None) == (ids is None):
        raise DiffError("give exactly one of a prompt or token ids")
    if ids is not None:
        ids = [int(i) for i in np.asarray(ids).ravel()]
    else:
        try:
            ids = model.encode(prompt)
        except ValueError as e:
            raise DiffError(str(e)) from None
    if not ids:
        raise DiffError("the input has no tokens")
    vocab = getattr(model, "vocab_size", None)
    bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
    if bad:
        raise DiffError(f"token id {bad[0]} is out of range for a vocabulary of {vocab}")
    return ids


def run_reference(model: Any, prompt: str | None = None, ids: Sequence[int] | None = None,
                  ops: str | Iterable[str] | None = None, dtype: str | None = None, logits=None) -> Reference:
    """Run our reference on one input, keeping the ops matching ``ops`` (globs; default all).

    This is the program's own uncaptured executor with a keep-set: values not asked for
    are freed as soon as nothing reads them.  ``logits``: the positions the head computes,
    as ``trace(..., logits=)`` takes them ("all", "last", a slice, a list of positions; None:
    all unless past the logits budget); ``.logit_positions`` says which the head's tensors hold.
    """
    from workbench.precision import exact_float32

    m = load_model(model, dtype)
    token_ids = ids_for(m, prompt, ids)
    with exact_float32():  # TF32 off on CUDA for the reference; the user's MLX_ENABLE_TF32 restored after
        program = program_of(m, token_ids, dtype, logits)
        names = _select(program, ops)
        program, out, used, rows = _forward(m, token_ids, names, dtype, logits)
        values, dtypes = {}, {}
        for n in names:  # evaluate and convert one op at a time
            v = out.pop(n)
            dtypes[n] = dtype_name(v.dtype)
            values[n] = to_numpy(v)
        precision = _precision_of(used)
    path = model if isinstance(model, (str, os.PathLike)) else getattr(m, "path", None)
    path = os.path.abspath(path) if path is not None else None
    return Reference(values=values, order=list(program.names), ids=token_ids,
                     model=str(path) if path is not None else None, dtype=used,
                     inputs={op.name: tuple(op.inputs) for op in program.ops}, dtypes=dtypes,
                     matmul_precision=precision, logit_positions=rows.positions if rows is not None else None,
                     logits_note=rows.note if rows is not None else None)


def dump(model: Any, out: str | os.PathLike | None = None, prompt: str | None = None,
         ids: Sequence[int] | None = None, ops: str | Iterable[str] | None = None,
         dtype: str | None = None, keep_values: bool = True, logits=None) -> Reference:
    """Run the reference and (when ``out`` is given) write its activations as float32 safetensors.

    The file's metadata holds ``workbench.op_order`` (JSON list of every op of the
    program, in execution order), ``workbench.ids`` (the token ids), ``workbench.model``,
    ``workbench.dtype`` and ``workbench.logit_positions`` (``"all"`` or the list of positions
    the ``logits`` and ``lm_head`` tensors hold rows for: ``logits=`` as :func:`run_reference`).  An existing ``out`` is replaced only if it is itself a
    workbench dump (a checkpoint shard given by mistake is never overwritten).
    ``keep_values=False`` (the CLI) streams the file op by op and returns the Reference
    without values: memory stays at the forward's own.
    """
    if out is not None and os.path.exists(out) and not is_reference_dump(out):
        raise DiffError(f"{out} exists and is not a workbench dump: not overwriting it")
    if out is not None and not keep_values:
        return _dump_streaming(model, out, prompt, ids, ops, dtype, logits)
    ref = run_reference(model, prompt=prompt, ids=ids, ops=ops, dtype=dtype, logits=logits)
    if out is not None:
        ref.save(out)
    return ref


def _select(program, ops) -> list[str]:
    if ops is None:
        names = program.names
    elif not isinstance(ops, str) and set(ops) <= set(program.names):  # exact op names
        wanted = set(ops)
        names = [n for n in program.names if n in wanted]
    else:
        names = program.match(ops)
    if not names:
        raise DiffError(f"no op matches {ops!r}")
    return names


def _dump_streaming(model, out, prompt, ids, ops, dtype, logits=None) -> Reference:
    """Write the dump op by op: the header from the lazy shapes, then each value as it is
    evaluated, so peak memory is the forward's own live set, not every activation."""
    from workbench.precision import exact_float32

    m = load_model(model, dtype)
    token_ids = ids_for(m, prompt, ids)
    with exact_float32():  # TF32 off on CUDA for the reference; the user's MLX_ENABLE_TF32 restored after
        names = _select(program_of(m, token_ids, dtype, logits), ops)
        program, lazy, used, rows = _forward(m, token_ids, names, dtype, logits)
        shapes = {n: tuple(lazy[n].shape) for n in names}
        dtypes = {n: dtype_name(lazy[n].dtype) for n in names}
        path = model if isinstance(model, (str, os.PathLike)) else getattr(m, "path", None)
        ref = Reference(values={}, order=list(program.names), ids=token_ids,
                        model=os.path.abspath(path) if path is not None else None,
                        dtype=used,
                        inputs={op.name: tuple(op.inputs) for op in program.ops}, dtypes=dtypes,
                        matmul_precision=_precision_of(used),
                        logit_positions=rows.positions if rows is not None else None,
                        logits_note=rows.note if rows is not None else None)
        readers.write_dump_streaming(out, shapes, ref.order, ref.metadata(), lambda n: to_numpy(lazy.pop(n)))
    return ref
