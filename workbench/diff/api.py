"""Python API: diff an engine's dump against our reference (:func:`compare`).

Running the reference and dumping it (:class:`Reference`, :func:`run_reference`, :func:`dump`,
:func:`is_reference_dump`) is workbench/diff/reference_run.py; the local errors
(workbench/diff/local.py) and the head's rows (workbench/diff/logit_rows.py) are their own
modules too.  Their names stay importable from here.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from workbench.diff import readers
from workbench.dtypes import dtype_name, parse_dtype
from workbench.diff.metrics import Tolerance
from workbench.diff.naming import Rules, apply_rules, load_rules
from workbench.diff.report import DiffError, DiffReport, as_rules, compare_arrays, match_names, to_numpy
from workbench.diff.weights import compare_weights, is_checkpoint_tensor
# (split out of this module, issues 34 and 43; their names stay importable from here)
from workbench.diff.local import growth_verdicts, is_module_level, local_errors, topk_dependents  # noqa: F401
from workbench.diff.logit_rows import (META_LOGITS, align_logits, describe, head_ops,  # noqa: F401
                                       logit_rows_for, parse_positions, positions_json, rows_of)
from workbench.diff.reference_run import (META_PRECISION, Reference, dump, ids_for,  # noqa: F401
                                          is_reference_dump, load_model, program_of, run_reference)


def _precision_warning(report: DiffReport, reference: str | None, emeta: Mapping) -> None:
    """Record both sides' matmul precision on ``report`` and warn (one line) when one side's
    float32 matmuls ran as TF32 and the other's did not."""
    from workbench.precision import warning

    engine = emeta.get(META_PRECISION) or None
    report.precision = {"reference": reference, "engine": engine}
    report.precision_warning = warning(reference, engine)


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
            loaded = load_model(model.model, None)
            vocab = getattr(loaded, "vocab_size", None)
            bad = [i for i in (model.ids or ()) if vocab is not None and i >= vocab]
            if bad:
                raise DiffError(f"the reference dump: token id {bad[0]} in its metadata ({readers.META_IDS}) is out of range "
                                f"for the vocabulary of {model.model} ({vocab})")
            topk = topk_dependents(program_of(loaded, model.ids, None))
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
    m = load_model(model, dtype)
    if prompt is None and ids is None and readers.META_IDS in emeta:
        ids = json.loads(emeta[readers.META_IDS])
    token_ids = ids_for(m, prompt, ids)
    program = program_of(m, token_ids, dtype)
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
