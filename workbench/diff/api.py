"""Python API: run the reference, dump its activations, diff an engine's dump against it."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from workbench.diff import readers
from workbench.dtypes import dtype_name, parse_dtype
from workbench.diff.metrics import Tolerance
from workbench.diff.naming import Rules, load_rules
from workbench.diff.naming import apply_rules
from workbench.diff.report import DiffError, DiffReport, as_rules, compare_arrays, match_names, to_numpy
from workbench.diff.weights import compare_weights, is_checkpoint_tensor
# (split out of this module, issue 34; their names stay importable from here)
from workbench.diff.local import growth_verdicts, is_module_level, local_errors, topk_dependents  # noqa: F401
from workbench.diff.logit_rows import (META_LOGITS, align_logits, describe, head_ops,  # noqa: F401
                                       logit_rows_for, parse_positions, positions_json, rows_of)


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


def _precision_warning(report: DiffReport, reference: str | None, emeta: Mapping) -> None:
    """Record both sides' matmul precision on ``report`` and warn (one line) when one side's
    float32 matmuls ran as TF32 and the other's did not."""
    from workbench.precision import warning

    engine = emeta.get(META_PRECISION) or None
    report.precision = {"reference": reference, "engine": engine}
    report.precision_warning = warning(reference, engine)


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


def _load_model(model: Any, dtype: str | None):
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


def _program_of(m, token_ids, dtype, logits=None):
    return _forward(m, token_ids, (), dtype, logits)[0] if is_module_level(m) else m.program


def _ids_for(model, prompt: str | None, ids: Sequence[int] | None) -> list[int]:
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

    m = _load_model(model, dtype)
    token_ids = _ids_for(m, prompt, ids)
    with exact_float32():  # TF32 off on CUDA for the reference; the user's MLX_ENABLE_TF32 restored after
        program = _program_of(m, token_ids, dtype, logits)
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

    m = _load_model(model, dtype)
    token_ids = _ids_for(m, prompt, ids)
    with exact_float32():  # TF32 off on CUDA for the reference; the user's MLX_ENABLE_TF32 restored after
        names = _select(_program_of(m, token_ids, dtype, logits), ops)
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


def _rules(rules: Any) -> Rules:
    if rules is None:
        return []
    if isinstance(rules, (str, os.PathLike)):
        return load_rules(rules)
    return as_rules(rules)  # pairs of strings, compiled rules, re.Pattern pairs


def _automap(auto: bool, explicit: bool, adapter, known, eng: Mapping, order: Sequence[str], reference, T: int,
             emeta: Mapping, tolerance, is_weight=None):
    """The engine's names matched by value (workbench/diff/automap.py) where asked (``rules="auto"``)
    or where neither rules nor an adapter were given and few of its names are ours; else None.
    ``reference()``: our (values, dtypes) by op."""
    from workbench.diff import automap

    if adapter is not None or known is not None:
        if auto:
            raise DiffError("--map auto matches the engine's names by value: not with an engine adapter (--engine, "
                            "or one the dump's metadata names) nor a printed (partial) dump")
        return None
    few, hit, total = automap.names_match_few(eng, order, is_weight)
    if not auto and (explicit or not few):
        return None
    reason = None if auto else (f"the engine's names matched {hit} of its {total} tensors, so they were matched "
                                "by value as --map auto does; --map RULES.json gives them")
    try:
        engine_order = readers.dump_order(emeta)
    except readers.DumpError:
        engine_order = None
    values, dtypes = reference()
    skip = [n for n in eng if is_weight is not None and is_weight(n)]
    return automap.propose(eng, values, order, tokens=T or None, dtypes=dtypes, engine_order=engine_order,
                           tolerance=tolerance, skip=skip, reason=reason, is_weight=is_weight)


def _dtype_name(d) -> str | None:
    if d is None:
        return None
    try:
        return dtype_name(parse_dtype(d))
    except ValueError as e:
        raise DiffError(str(e)) from None


def _restrict(ref: Reference, logits, T: int) -> tuple[dict, list[int]]:
    """A reference dump's values with its head's rows cut to the positions ``logits`` asks for
    (they must be among the dump's), and those positions."""
    from workbench.trace.logits import resolve

    have = list(ref.positions or ())
    if logits is None:
        return ref.values, have
    want = list(resolve(logits, T).positions)
    if not set(want) <= set(have):
        raise DiffError(f"logits={logits!r}: the reference dump holds logits at {describe(have, T)}, not at "
                        f"{describe(want, T)}: dump it again with those (or diff against the checkpoint)")
    values = dict(ref.values)
    idx = [have.index(p) for p in want]
    for n in head_ops(ref.order):
        if n in values:
            values[n] = rows_of(to_numpy(values[n]), idx)
    return values, want


def _kinds(model: Any) -> dict[str, str]:
    """Op name -> its kind (empty for a module-level model)."""
    return {op.name: op.kind for op in model.program.ops} if not is_module_level(model) else {}


def _split_weights(model: Any, eng: dict, rules, op_names) -> dict:
    """Take out of ``eng`` the tensors whose renamed name is a checkpoint tensor, not an op."""
    ops = set(op_names)
    weights = {}
    for en in list(eng):
        name = apply_rules(en, rules)
        if name not in ops and is_checkpoint_tensor(model, name):
            if name in weights:
                raise DiffError(f"engine tensors {weights[name][0]!r} and {en!r} both map to weight {name!r}")
            weights[name] = (en, to_numpy(eng.pop(en)))
    return weights


def compare(model: Any, engine: Any, prompt: str | None = None, ids: Sequence[int] | None = None,
            rules: Any = None, tolerance: Tolerance | dict | None = None, dtype: str | None = None,
            noise_floor: str | None = None, local: bool = True, logits=None, engine_adapter: str | None = None,
            decode: bool | None = None, engine_dtype: str | None = None) -> DiffReport:
    """Diff an engine dump against our reference.

    ``model``: a checkpoint path, a loaded model, a :class:`Reference`, or the path of a
    reference dump written by :func:`dump` (then no prompt is needed).  ``engine``: a
    dump path (.safetensors, .npz, directory of .npy) or a mapping of arrays.  ``rules``:
    a rules JSON path, a list of ``[regex, replacement]`` pairs, or ``"auto"``: the engine's names
    matched by value (workbench/diff/automap.py; the report's ``automap`` holds the proposal and its
    rules).  With no rules and no adapter, names of which fewer than half are ours are matched by
    value too, and the report says so.  Only the ops the
    engine has a tensor for are captured.  ``noise_floor``: the engine's compute dtype
    ("bfloat16", "float16"): our reference is also run in it and every op is held to a
    multiple of that run's error instead of fixed limits (the reference itself then runs
    in float32 unless ``dtype`` says otherwise).  ``local``: also compute each op's local
    error (our op on the engine's own inputs; needs the model, about one more forward).
    ``logits``: the positions the head's tensors (``lm_head``, ``logits``) are compared at, as
    ``trace(..., logits=)`` takes them (None: what the reference holds, its default: all unless
    past the logits budget); a reference dump's own positions must include them.  An engine's
    head tensor holds every position (T rows), the last alone (one row), or the positions its
    dump's ``workbench.logit_positions`` names; the rows both sides hold are compared (the
    report's ``logits`` says which), and positions that cannot be lined up are a DiffError.
    ``engine_adapter``: "transformers" or "llama.cpp" (workbench/diff/engines): the engine's names
    and layouts put in ours with no rules (default: the one its dump's metadata names, as
    :func:`torch_hooks` and the llama.cpp eval-callback reader record).  ``engine`` may also be
    llama-eval-callback's text output.  ``decode``: the engine's dump is one decode step (the last
    of ``ids`` through its KV cache), compared with our full forward's row at that position
    (default: what the dump's ``workbench.decode`` metadata says, else what its shapes say:
    one position's values where the prompt has several).  ``engine_dtype``: the
    precision the engine computes in ("float32", "bfloat16", "float16"; default: what its
    dump's metadata says, else what its values are exact in), each op's local error then held
    to its rounding at that precision (workbench/diff/budget.py).
    """
    from workbench.diff.budget import engine_precision, parse_precision
    from workbench.precision import exact_float32

    try:
        engine_dtype = parse_precision(engine_dtype)
    except ValueError as e:
        raise DiffError(str(e)) from None

    from workbench.diff import automap

    auto, explicit = automap.is_auto(rules), rules is not None
    rules = [] if auto else _rules(rules)
    noise_floor = _dtype_name(noise_floor)
    if noise_floor is not None and dtype is None:
        dtype = "float32"
    if noise_floor is not None and _dtype_name(dtype) == noise_floor:
        raise DiffError(f"the noise floor dtype {noise_floor} is the reference's own dtype: nothing to calibrate "
                        "against (run the reference in float32)")
    from workbench.diff import engine_glue as glue

    known = None
    if isinstance(engine, Mapping):
        eng, emeta = dict(engine), {}
    elif glue.is_eval_callback_text(engine):
        eng, emeta, known = glue.read_eval_callback(engine)
    else:
        eng, emeta = readers.read_dump(engine)
    adapter = glue.adapter_for(engine_adapter, emeta)
    tolerance = glue.engine_tolerance(tolerance, emeta)
    if decode is None and glue.META_DECODE in emeta:
        decode = emeta.get(glue.META_DECODE) == "1"
    decode_note = None
    where = engine if not isinstance(engine, Mapping) else "the engine mapping"
    if not eng:
        raise DiffError(f"{engine if not isinstance(engine, Mapping) else 'the engine mapping'}: holds no tensors")
    if isinstance(model, (str, os.PathLike)) and is_reference_dump(model):
        model = Reference.load(model)
    if isinstance(model, Reference):
        if prompt is not None:
            raise DiffError("a reference dump carries its own token ids; give no --prompt (or diff against the checkpoint)")
        if ids is not None and model.ids is not None and [int(i) for i in ids] != list(model.ids):
            raise DiffError(f"the reference dump was made for ids {model.ids}, not {list(ids)}")
        noise = None
        if noise_floor is not None:
            if not model.model or not os.path.exists(model.model):
                raise DiffError("a noise floor needs the model: this reference dump does not name a checkpoint "
                                "that exists here; pass the checkpoint instead")
            if model.dtype == noise_floor:
                raise DiffError(f"this reference dump was computed in {noise_floor}, the noise floor's own dtype")
        T = len(model.ids) if model.ids else 0
        if logits is not None and not T:
            raise DiffError(f"logits={logits!r}: the reference dump holds no token ids ({readers.META_IDS}) to "
                            "place positions in")
        ref_values, ref_pos = _restrict(model, logits, T) if T else (model.values, None)
        eng, known, ainfo = glue.adapt(adapter, eng, model.order, model.model, known)
        proposal = _automap(auto, explicit, adapter, known, eng, model.order, lambda: (model.values, model.dtypes),
                            T, emeta, tolerance)
        rules = rules if proposal is None else proposal.compiled()
        printed: dict = {}
        if decode is None:
            decode, decode_note = glue.infer_decode(ref_values, eng, rules, T, where)
        if decode:
            ref_values = glue.decode_rows(ref_values, head_ops(model.order), T)
        elif adapter is not None and adapter.output_rows:
            ref_values = glue.output_rows(ref_values, eng, head_ops(model.order), T, ainfo.setdefault("notes", {}))
        glue.choose(eng, ref_values, ainfo)
        if noise_floor is not None:
            matched, _, _ = match_names(eng.keys(), [n for n in model.order if n in model.values], rules)
            noise = run_reference(model.model, ids=model.ids, ops=list(matched) or None, dtype=noise_floor,
                                  logits=list(ref_pos) if ref_pos else None).values
        aligned: dict = {}
        topk, loaded, weights = None, None, {}
        if model.model and os.path.exists(model.model):
            loaded = _load_model(model.model, None)
            vocab = getattr(loaded, "vocab_size", None)
            bad = [i for i in (model.ids or ()) if vocab is not None and i >= vocab]
            if bad:
                raise DiffError(f"the reference dump: token id {bad[0]} in its metadata ({readers.META_IDS}) is out of range "
                                f"for the vocabulary of {model.model} ({vocab})")
            topk = topk_dependents(_program_of(loaded, model.ids, None))
            weights = _split_weights(loaded, eng, rules, model.order)
        ref_values = dict(ref_values)
        compared, info = align_logits(ref_values, eng, model.order, rules, T, ref_pos, emeta, noise)
        report = compare_arrays(ref_values, eng, order=model.order, rules=rules, tolerance=tolerance,
                                inputs=model.inputs, noise=noise, noise_dtype=noise_floor, aligned=aligned,
                                topk=topk, tokens=(1 if decode else len(model.ids)) if model.ids else None,
                                empty_ok=bool(weights), known=known,
                                key_cut=adapter.cuts_keys if adapter else None, notes=ainfo.get("notes"),
                                printed=printed)
        report.logits = info
        glue.finish(report, adapter, ainfo, decode, decode_note)
        if weights:
            report.weights = compare_weights(loaded, weights, report.tolerance)
        report.engine_total += len(weights)  # the dump's weights count in its coverage
        if local and loaded is not None and model.ids:
            if known is None:
                report.engine_precision = engine_precision(aligned, _kinds(loaded), engine_dtype,
                                                           emeta.get(glue.META_ENGINE_DTYPE))
            with exact_float32():
                local_errors(report, loaded, aligned, model.ids, dtype=model.dtype, dtypes=model.dtypes,
                             logit_rows=logit_rows_for(compared, T, getattr(loaded, "vocab_size", None)),
                             decode=decode, precision=report.engine_precision)
            growth_verdicts(report, loaded.program, report.engine_precision)
        _precision_warning(report, model.matmul_precision, emeta)
        report.pattern = glue.pattern(report, ref_values, {**aligned, **printed}, loaded, decode)
        report.automap = proposal
        return report
    m = _load_model(model, dtype)
    if prompt is None and ids is None and readers.META_IDS in emeta:
        ids = json.loads(emeta[readers.META_IDS])
    token_ids = _ids_for(m, prompt, ids)
    program = _program_of(m, token_ids, dtype)
    eng, known, ainfo = glue.adapt(adapter, eng, program.names, m, known)

    def everything():
        full = run_reference(m, ids=token_ids, dtype=dtype, logits=logits)
        return full.values, full.dtypes

    proposal = _automap(auto, explicit, adapter, known, eng, program.names, everything, len(token_ids), emeta,
                        tolerance, lambda n: is_checkpoint_tensor(m, n))
    rules = rules if proposal is None else proposal.compiled()
    printed: dict = {}
    weights = _split_weights(m, eng, rules, program.names)
    matched, _, _ = match_names(eng.keys(), program.names, rules)
    values: dict = {}
    noise = None
    dtypes: dict = {}
    precision = None
    ref_pos = None
    if matched:
        maybe = [c for cands in ainfo.get("alternatives", {}).values() for c in cands if c not in matched]
        ref = run_reference(m, ids=token_ids, ops=list(matched) + maybe, dtype=dtype, logits=logits)
        values, dtypes, precision, ref_pos = dict(ref.values), ref.dtypes, ref.matmul_precision, ref.positions
        if noise_floor is not None:
            noise = run_reference(m, ids=token_ids, ops=list(matched), dtype=noise_floor,
                                  logits=list(ref_pos) if ref_pos else None).values
        if decode is None:
            decode, decode_note = glue.infer_decode(values, eng, rules, len(token_ids), where)
        if decode:
            values = glue.decode_rows(values, head_ops(program.names), len(token_ids))
            noise = None if noise is None else glue.decode_rows(noise, head_ops(program.names), len(token_ids))
        elif adapter is not None and adapter.output_rows:
            values = glue.output_rows(values, eng, head_ops(program.names), len(token_ids),
                                      ainfo.setdefault("notes", {}))
            noise = None if noise is None else glue.output_rows(noise, eng, head_ops(program.names), len(token_ids), {})
        glue.choose(eng, values, ainfo)
    elif logits is not None:  # (refused in one line as the run would: nothing else checks it)
        from workbench.trace.logits import resolve

        resolve(logits, len(token_ids))
    aligned: dict = {}
    compared, info = align_logits(values, eng, program.names, rules, len(token_ids), ref_pos, emeta, noise)
    report = compare_arrays(values, eng, order=program.names, rules=rules, tolerance=tolerance,
                            inputs={op.name: tuple(op.inputs) for op in program.ops}, noise=noise,
                            noise_dtype=noise_floor, aligned=aligned, topk=topk_dependents(program),
                            tokens=1 if decode else len(token_ids), empty_ok=bool(weights), known=known,
                            key_cut=adapter.cuts_keys if adapter else None, notes=ainfo.get("notes"),
                                printed=printed)
    report.logits = info
    glue.finish(report, adapter, ainfo, bool(decode), decode_note)
    if weights:
        report.weights = compare_weights(m, weights, report.tolerance)
    report.engine_total += len(weights)  # the dump's weights count in its coverage
    if local and matched:
        if known is None:
            report.engine_precision = engine_precision(aligned, _kinds(m), engine_dtype,
                                                       emeta.get(glue.META_ENGINE_DTYPE))
        with exact_float32():
            local_errors(report, m, aligned, token_ids, dtype=dtype, dtypes=dtypes,
                         logit_rows=logit_rows_for(compared, len(token_ids), getattr(m, "vocab_size", None)),
                         decode=decode, precision=report.engine_precision)
        if not is_module_level(m):
            growth_verdicts(report, m.program, report.engine_precision)
    _precision_warning(report, precision, emeta)
    report.pattern = glue.pattern(report, values, {**aligned, **printed}, m, decode)
    report.automap = proposal
    return report
