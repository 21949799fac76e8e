"""Misnamed or missing? Unexpected tensors paired with the missing ones they most likely are:
exact renames first (one dotted component changed, or an extra leading prefix), then the
nearest expected name of the same layer. Used by :func:`workbench.checkpoint.checks.check_arch`."""
from __future__ import annotations

from collections import Counter

from workbench.checkpoint import names as N

#: unexpected / missing tensors that get a difflib nearest-name suggestion (each costs a few
#: dozen string comparisons; a hostile checkpoint with 100k of them stays fast)
SUGGEST_MAX = 2000


def report_misnamed(cx, report, a, present, unexpected, missing, miss_names):
    """One problem per unexpected and per missing tensor, each with the nearest name on the
    other side: misnamed vs missing (candidates from the same layer, through an index:
    near-linear even with 100k unexpected tensors)."""
    miss_by, exp_by = N.NearIndex(miss_names), N.NearIndex(a.expected)
    renamed, rules = rename_matches(unexpected, miss_names)
    if rules:
        (a_, b_), cnt = rules.most_common(1)[0]
        if cnt >= 3:
            how = f"an extra leading {b_!r}" if not a_ else f"{a_!r} -> {b_!r} in the name"
            report.notes.append(f"{cnt} unexpected tensors are expected ones renamed ({how}): misnamed, not missing")
    if len(unexpected) > SUGGEST_MAX or len(missing) > SUGGEST_MAX:
        report.notes.append(f"{len(unexpected)} unexpected and {len(missing)} missing tensors: nearest-name "
                            f"suggestions for the first {SUGGEST_MAX} of each only")
    for i, n in enumerate(unexpected):
        ti = present[n]
        near = [renamed[n]] if n in renamed else []
        if not near and i < SUGGEST_MAX:
            near = [x for x in (miss_by.nearest(n),) if x]
        if not near and i < SUGGEST_MAX:
            near = [x for x in (exp_by.nearest(n),) if x]
        sug = cx.stored(near[0]) if near else None
        msg = f"{ti.source_name} ({ti.dtype} {list(ti.shape)}) is not a tensor of {a.family}"
        if n in cx.made:  # made by the reference's sanitize
            msg = f"{made_from(cx, n)} {'become' if len(cx.made[n]) > 1 else 'becomes'} {n} ({ti.dtype} " \
                  f"{list(ti.shape)}) when the reference's sanitize converts it, which is not a tensor of {a.family}"
        if near and near[0] in miss_names:
            msg += f"; misnamed? the expected {sug} is missing"
        elif near:
            msg += f"; nearest expected name: {sug}"
        cx.add("unexpected-tensor", "error", msg, tensor=ti.source_name, file=ti.file, suggestion=sug)
    unexp_by = N.NearIndex(unexpected)
    renamed_back = {m: u for u, m in renamed.items()}
    said = set()
    for i, e in enumerate(missing):
        near = [renamed_back[e.name]] if e.name in renamed_back else \
            [x for x in (unexp_by.nearest(e.name),) if x] if i < SUGGEST_MAX else []
        sug = present[near[0]].source_name if near else None
        msg = f"{cx.stored(e.name)} ({list(e.shape)}) is missing"
        if e.name in cx.made_from:  # an expected tensor the reference's sanitize makes from a stored one
            if cx.stored(e.name) in said:
                continue
            said.add(cx.stored(e.name))
            msg = f"{cx.stored(e.name)} is missing (the reference's sanitize makes {e.name} {list(e.shape)} from it)"
        if sug:
            msg += f"; a tensor named {sug} exists: misnamed?"
        cx.add("missing-tensor", "error", msg, tensor=cx.stored(e.name), layer=e.layer, suggestion=sug)


def rename_matches(unexpected, missing):
    """Pair unexpected names with missing ones that differ in exactly one dotted component
    (``layers`` -> ``blocks``, ``down_proj`` -> ``down_prj``) or by a leading prefix of one or
    two components (``transformer.``). Linear time: every name is indexed once per component.
    Returns ({unexpected: missing}, Counter({(expected_part, found_part): count}))."""
    rules = Counter()
    out = {}
    if not unexpected or not missing:
        return out, rules
    index = {}
    for m in missing:
        t = m.split(".")
        for i in range(len(t)):
            if not t[i].isdigit():
                index.setdefault((len(t), i, tuple(t[:i]), tuple(t[i + 1:])), []).append(m)
    full = set(missing)
    taken = set()
    for u in unexpected:
        t = u.split(".")
        hit = None
        for k in (1, 2):  # an extra leading prefix
            if len(t) > k and ".".join(t[k:]) in full:
                hit, rule = ".".join(t[k:]), ("", ".".join(t[:k]) + ".")
                break
        if hit is None:
            for i in range(len(t)):
                if t[i].isdigit():
                    continue
                c = index.get((len(t), i, tuple(t[:i]), tuple(t[i + 1:])))
                if c and len(c) == 1:
                    hit, rule = c[0], (c[0].split(".")[i], t[i])
                    break
        if hit is not None and hit not in taken:
            out[u] = hit
            taken.add(hit)
            rules[rule] += 1
    return out, rules


def made_from(cx, canon: str) -> str:
    """The stored tensors the reference's sanitize makes ``canon`` from, with their shapes."""
    srcs = cx.made[canon]
    out = []
    for s in srcs[:3]:
        st = cx.ck.tensors.get(s)
        out.append(f"{s} {list(st.shape)}" if st is not None else s)
    return ", ".join(out) + (f" ... ({len(srcs)} tensors)" if len(srcs) > 3 else "")
