"""Names matched by value: an engine's tensors mapped onto our ops with no rules written (issue 42).

A porter's engine names its tensors its own way (``blk0.att_q_proj``, ``tok_emb``).  Where few
of its names are ours (or with ``--map auto``), every engine tensor is compared with our ops
of a compatible shape (layouts reconciled as the diff does, workbench/diff/layout.py: a batch
axis, heads split or merged, transposed; or the last position only) and the mapping proposed:

1. **by value**: a tensor within the diff's tolerance of an op (relative RMS error in float64),
   nearer it than any other op by more than one rounding (workbench/diff/budget.py, at the
   coarser precision of the two sides), is that op.  Ops holding the same values (``k_rope``
   and ``k_cache``, ``q_proj`` and its heads) are told apart by the names' likeness, the layout
   needing the fewest steps, then program order (the others are listed as ``same``).
2. **by name structure**: the digits of a name that vary from name to name are its layer
   (``blk3.att_q_proj``: layer 3, shifted by the offset the value matches show); names that
   differ only there form one *rule*, mapped to the op template most of its layers matched by
   value: ``^blk(\\d+)\\.att_q_proj$`` -> ``layers.\\1.self_attn.q_proj``.  So behind a real
   bug, the layers past it follow the rule the layers before it taught.
3. **by shape**: a rule or name no layer matched by value (a bug in the very first ops) takes the
   free op of its shape, its layers in order, its values are most like (cosine); two such ops
   within rounding of each other are a tie.  Only where something else matched by value: a
   dump wrong from its first op on (weights dequantized wrongly) maps nothing by shape alone.
   Where the dump records the engine's order (``workbench.op_order``; the C tap writes it),
   two names mapped by shape whose order it contradicts trade ops.

Two engine names tied for one op, or one name tied between ops of different values, are
listed as ambiguous, never guessed silently (a tie between ops of different values is left
unmapped).  Bounded: pairs are scored on a fixed sample of positions first (at most
:data:`SAMPLE` elements, fewer when there are many pairs), as float64 matrix products; each
tensor's best two candidates are confirmed on the whole tensor.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from workbench.arrays import to_numpy
from workbench.diff.automap_names import Name, parse, replacement, weight_rules
from workbench.diff.automap_values import SAMPLE, Scorer, same_values, targets as our_targets
from workbench.diff.budget import BITS, FACTOR, value_precision
from workbench.diff.metrics import Tolerance
from workbench.diff.report_data import MIN_COVERAGE

AUTO = "auto"


def is_auto(rules: Any) -> bool:
    return isinstance(rules, str) and rules == AUTO


def names_match_few(engine_names: Iterable[str], ours: Sequence[str], also: Callable[[str], bool] | None = None,
                    share: float = MIN_COVERAGE) -> tuple[bool, int, int]:
    """(fewer than ``share`` of the engine's names are op names of ours (or ``also``: its weights), the
    number that are, the number of names); by default the share a verdict needs (report_data.MIN_COVERAGE)."""
    names = list(engine_names)
    known = set(ours)
    hit = sum(1 for n in names if n in known or (also is not None and also(n)))
    return bool(names) and hit < share * len(names), hit, len(names)


# ----------------------------------------------------------------------------- the proposal
@dataclass
class Match:
    """One engine tensor's proposed op.  ``how``: "value" (its values are that op's within the
    diff's tolerance), "rule" (its name follows a rule other layers matched by value), "shape"
    (no layer matched by value: the free op of its shape its values are most like), "weight" (``op``
    is a checkpoint tensor its name holds: automap_names.weight_rules), "ambiguous" or "none" (op
    None).  ``rel``: relative RMS error against the op; ``same``: ops holding the same values, told
    apart by the names, the layout and program order."""

    engine: str
    op: str | None
    how: str
    rel: float | None = None
    cosine: float | None = None
    last: bool = False  # compared with our op's last position (the engine holds that one)
    rule: int | None = None
    same: list = field(default_factory=list)

    def to_dict(self) -> dict:
        num = (lambda x: None if x is None or not math.isfinite(x) else float(x))
        return {"engine": self.engine, "op": self.op, "how": self.how, "rel": num(self.rel),
                "cosine": num(self.cosine), "last_position": self.last, "rule": self.rule, "same": list(self.same)}


@dataclass
class Proposal:
    """The mapping proposed for an engine's names (:func:`propose`): ``matches`` (one per engine
    tensor), ``rules`` (``[regex, replacement]`` pairs, the ``--map`` format), ``ambiguous``
    (ties listed, never guessed silently), ``offset`` (our layer = the engine's + offset) and
    ``reason`` (why it was proposed without being asked, else None)."""

    matches: list[Match]
    rules: list[list[str]]
    ambiguous: list[dict] = field(default_factory=list)
    offset: int = 0
    reason: str | None = None

    @property
    def mapping(self) -> dict[str, str]:
        return {m.engine: m.op for m in self.matches if m.op is not None}

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(m.how for m in self.matches)
        return {k: c.get(k, 0) for k in ("value", "rule", "shape", "weight", "ambiguous", "none")}

    def compiled(self):
        from workbench.diff.naming import compile_rules

        return compile_rules(self.rules, where="the proposed map")

    def to_dict(self) -> dict:
        return {"reason": self.reason, "rules": [list(r) for r in self.rules], "offset": self.offset,
                "counts": self.counts, "matches": [m.to_dict() for m in self.matches],
                "ambiguous": list(self.ambiguous),
                "unmapped": [m.engine for m in self.matches if m.op is None]}

    def text(self, max_rules: int = 30, max_ties: int = 10) -> list[str]:
        c = self.counts
        why = self.reason or "--map auto"
        how = [f"{c[k]} by {w}" for k, w in (("value", "value"), ("rule", "the rule of other layers"),
                                               ("shape", "shape and likeness"),
                                               ("weight", "name as checkpoint weights")) if c[k]]
        n = len(self.ambiguous)
        ties = (f"{n} tie{'s' if n != 1 else ''} listed" + (f" ({c['ambiguous']} tensors left unmapped)"
                                                             if c["ambiguous"] else "")) if n else "no ties"
        lines = [f"names matched by value ({why}): {len(self.mapping)} of {len(self.matches)} engine tensors mapped"
                 + (f" ({', '.join(how)})" if how else "") + f", {ties}"
                 + (f", {c['none']} with no op of ours" if c["none"] else "")
                 + (f"; our layer = the engine's {self.offset:+d}" if self.offset else "")]
        per_rule: dict[int, list[Match]] = defaultdict(list)
        for m in self.matches:
            if m.rule is not None:
                per_rule[m.rule].append(m)
        for k, (rx, rep) in enumerate(self.rules[:max_rules]):
            ms = per_rule.get(k, [])
            if not ms:
                continue
            hows = Counter(m.how for m in ms)
            worst = max((m.rel for m in ms if m.rel is not None), default=None)
            lines.append(f"  {rx} -> {rep or '(dropped)'}  ({len(ms)} tensor{'s' if len(ms) != 1 else ''}: "
                         + ", ".join(f"{n} by {h}" for h, n in hows.items())
                         + (f"; worst rel {worst:.2g}" if worst is not None and math.isfinite(worst) else "") + ")")
        if len(self.rules) > max_rules:
            lines.append(f"  ... (+{len(self.rules) - max_rules} rules; --json lists them)")
        for a in self.ambiguous[:max_ties]:
            lines.append(f"  ambiguous: {', '.join(a['engine'])} -> {' or '.join(a['ops'])}: {a['why']}")
        if len(self.ambiguous) > max_ties:
            lines.append(f"  ... (+{len(self.ambiguous) - max_ties} ties; --json lists them)")
        return lines

    def write(self, path) -> None:
        """The rules as a ``--map`` file (``{"rules": [...]}``, the ties and the unmapped beside
        them to edit); a new file, written whole (workbench.fsio)."""
        from workbench import fsio

        fsio.check_destination(path)
        d = self.to_dict()
        rows = ",\n  ".join(json.dumps(r) for r in d["rules"])
        text = ("{\"about\": " + json.dumps("proposed by workbench diff --map auto (names matched by value); edit "
                                            "freely and pass back with --map FILE")
                + ",\n \"rules\": [\n  " + rows + "],\n \"ambiguous\": " + json.dumps(d["ambiguous"])
                + ",\n \"unmapped\": " + json.dumps(d["unmapped"]) + "}\n")
        fsio.write_text(path, text)


@dataclass
class _Option:
    """One engine name group (a rule) given one op template of ours."""

    group: tuple
    template: str
    mapped: dict  # engine index -> target index
    ops: frozenset
    votes: int  # its names whose values match the op
    rel: float  # mean relative error
    cos: float  # mean cosine
    cost: float  # mean layout cost
    index: int  # its first op's place in our program
    noise: float  # one rounding, relative
    chance: float  # the cosine unrelated values reach (4 sigma)


def _follow_engine_order(assigned: dict, groups: Mapping, targets: Sequence, first: Callable,
                         rank: Callable) -> None:
    """Names mapped by shape alone (behind a bug, their values say little) whose order the
    engine's dump contradicts -- of two such names of the same layers, the one it computed first
    took our later op -- trade ops, where each fits the other's: the engine's own order is
    the better evidence there (its raw logits before its soft-capped ones)."""
    by_layers: dict = defaultdict(list)  # (names of the same layers only are ordered against each other)
    for g, (_, mapped, phase) in assigned.items():
        if phase == "shape":
            by_layers[frozenset(targets[j].layer for j in mapped.values())].append(g)
    for shaped in by_layers.values():
        if len(shaped) <= ORDER_PAIRS_MAX:  # (bounded: a hostile dump's thousands are left as mapped)
            _trade_pairs(shaped, assigned, groups, targets, first, rank)


#: names mapped by shape, of the same layers, past which their order is not checked pair by pair
ORDER_PAIRS_MAX = 64


def _trade_pairs(shaped: list, assigned: dict, groups: Mapping, targets: Sequence, first: Callable,
                 rank: Callable) -> None:
    """Each pair of ``shaped`` whose order the engine's contradicts trades ops (where each fits
    the other's): :func:`_follow_engine_order`'s step for one set of layers."""
    for k, a in enumerate(shaped):
        for b in shaped[k + 1:]:
            (ta, ma, _), (tb, mb, _) = assigned[a], assigned[b]
            ours_first = min(targets[j].index for j in ma.values()) < min(targets[j].index for j in mb.values())
            if ours_first == (first(a) < first(b)):
                continue
            na, nb = {i: rank(i, tb) for i in groups[a]}, {i: rank(i, ta) for i in groups[b]}
            if all(j is not None and j >= 0 for j in (*na.values(), *nb.values())):
                assigned[a], assigned[b] = (tb, na, "shape"), (ta, nb, "shape")


def _layer(p: Name, offset: int) -> int | None:
    return None if p.layer is None else p.layer + offset


def propose(engine: Mapping[str, Any], reference: Mapping[str, Any], order: Sequence[str], tokens: int | None = None,
            dtypes: Mapping[str, str] | None = None, engine_order: Sequence[str] | None = None,
            tolerance: Tolerance | dict | None = None, skip: Iterable[str] = (), reason: str | None = None,
            is_weight: Callable[[str], bool] | None = None) -> Proposal:
    """Map ``engine``'s tensors (its names -> arrays) onto our ops (``reference``: op -> our
    values, ``order``: our execution order) by value, name structure and order (module doc).
    ``tokens``: the prompt's length (an engine tensor may hold the last position alone);
    ``dtypes``: our ops' dtypes; ``engine_order``: the engine's own execution order where its dump
    records it (resolves two of its tensors holding the same values); ``skip``: names left out
    (the engine's weights, named as ours); ``is_weight``: whether a name is a checkpoint tensor's (the
    engine's weights named its own way are then mapped by name, :func:`_weight_rules`)."""
    tol = Tolerance.from_any(tolerance)
    close = math.sqrt(tol.max_nmse)  # within the diff's tolerance of an op
    skip = set(skip)
    names = [n for n in engine if n not in skip]
    arrays = [to_numpy(engine[n]) for n in names]
    parsed = parse(names)
    targets = our_targets(reference, order, tokens, dict(dtypes or {}))
    sc = Scorer(arrays, targets, tol.mask_below, 2 * close).sweep()
    eprec: dict[int, str] = {}
    epos = {n: k for k, n in enumerate(engine_order)} if engine_order else {}
    known_order = bool(epos) and all(n in epos for n in names)

    def noise(i: int, j: int) -> float:  # one rounding of the coarser side, as the budget holds an op to
        if i not in eprec:
            eprec[i] = value_precision(arrays[i]) or "float32"
        return math.sqrt(FACTOR) * 2.0 ** -min(BITS[eprec[i]], BITS[targets[j].precision])

    best: dict[int, list[int]] = {}  # engine index -> its value matches, the chosen first
    for i, kept in sc.kept.items():
        row = {j: v for j, v in kept.items() if v is not None}
        r1 = min((v[0] for v in row.values()), default=math.inf)
        if not r1 <= close:
            continue
        j0 = min(row, key=lambda j: row[j][0])
        tied = [j for j in row if row[j][0] <= r1 + noise(i, j0)]
        fine = noise(i, j0) / 16  # (the same values differ by nothing: a finer step orders the rest)
        best[i] = sorted(tied, key=lambda j: (math.floor(row[j][0] / fine), targets[j].op != names[i], row[j][2],
                                              targets[j].index, targets[j].last))
    votes = Counter(targets[js[0]].layer - parsed[names[i]].layer for i, js in best.items()
                    if parsed[names[i]].layer is not None and targets[js[0]].layer is not None)
    offset = max(votes, key=lambda d: (votes[d], -abs(d))) if votes else 0

    by_tl: dict[tuple, list[int]] = defaultdict(list)  # (template, layer) or (op, None) -> targets
    for j, t in enumerate(targets):
        by_tl[(t.template, t.layer)].append(j)
        if t.layer is not None:
            by_tl[(t.op, None)].append(j)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, n in enumerate(names):
        groups[parsed[n].key].append(i)

    def rank(i, tmpl):  # member i's target under template tmpl: None (no such op), -1 (no fit)
        js = by_tl.get((tmpl, _layer(parsed[names[i]], offset)))
        if not js:
            return None
        fits = [j for j in js if sc.pair(i, j) is not None]
        return min(fits, key=lambda j: (targets[j].last, sc.pair(i, j)[2])) if fits else -1

    by_layer: dict = defaultdict(list)
    for j, t in enumerate(targets):
        by_layer[t.layer].append(j)

    options: list[_Option] = []
    for g, members in groups.items():
        if 2 * sum(1 for i in members if _layer(parsed[names[i]], offset) in by_layer) < len(members):
            continue  # most of its names hold no layer of ours: their digits are no layer number
        if parsed[names[members[0]]].slot is None:  # a name of no layer: any op, by its name
            tmpls = {targets[j].op for i in members for j, v in sc.kept[i].items() if v is not None}
        else:
            tmpls = {targets[j].template for i in members for j in by_layer.get(_layer(parsed[names[i]], offset), ())
                     if targets[j].layer is not None and targets[j].array.size == arrays[i].size}
        for tm in tmpls:
            mapped = {i: rank(i, tm) for i in members}
            if any(v == -1 for v in mapped.values()):
                continue  # a member of another shape: not this op
            mapped = {i: j for i, j in mapped.items() if j is not None}
            if not mapped or 2 * len(mapped) < len(members):
                continue  # most of its names hold no layer of ours: their digits are no layer number
            rows = [sc.pair(i, j) for i, j in mapped.items()]
            v = sum(1 for i, j in mapped.items() if i in best and targets[j].op in {targets[x].op for x in best[i]})
            i0, j0 = next(iter(mapped.items()))
            options.append(_Option(g, tm, mapped, frozenset(targets[j].op for j in mapped.values()), v,
                                   float(np.mean([min(r[0], 1e9) for r in rows])), float(np.mean([r[1] for r in rows])),
                                   float(np.mean([r[2] for r in rows])), min(targets[j].index for j in mapped.values()),
                                   noise(i0, j0), 4 / math.sqrt(min(SAMPLE, min(arrays[i].size for i in mapped)))))

    likeness: dict = {}

    def like(o: _Option) -> float:  # how alike the engine's names and the op's are (1: ours, as they are)
        if (o.group, o.template) not in likeness:
            likeness[(o.group, o.template)] = SequenceMatcher(None, parsed[names[groups[o.group][0]]].template(),
                                                              o.template, autojunk=False).ratio()
        return likeness[(o.group, o.template)]

    def shown(g) -> str:  # a rule's names, its layer digits as {i}
        return parsed[names[groups[g][0]]].template().replace("{}", "{i}")

    def first(g):  # a group's place in the engine's order (its names' order where unknown)
        return min(epos.get(names[i], 0) for i in groups[g]) if known_order else min(names[i] for i in groups[g])

    assigned: dict[tuple, tuple] = {}  # group -> (template, mapped, phase)
    taken: set = set()  # our ops given to a name
    ambiguous: list[dict] = []
    ranked = sorted((o for o in options if o.votes > 0),
                    key=lambda o: (-o.votes, math.floor(o.rel / (o.noise / 16)), -like(o), o.cost, o.index,
                                   first(o.group)))
    pending: list = []
    for o in ranked:  # 1. value matches, generalised
        if o.group in assigned or o.ops & taken:
            continue
        rivals = [r for r in ranked if r.group != o.group and r.group not in assigned and r.ops & o.ops
                  and r.votes == o.votes and abs(r.rel - o.rel) <= o.noise and r.cost == o.cost]
        assigned[o.group] = (o.template, o.mapped, "rule")
        taken |= o.ops
        if rivals and not known_order and like(o) < 1:
            pending.append((o, {o.group} | {r.group for r in rivals}))
    for o, tied in pending:  # several names, as many ops of the same values: which is which, by the names
        if all(g in assigned for g in tied):
            ambiguous.append({"engine": sorted(shown(x) for x in tied),
                              "ops": sorted({r.template.replace("{}", "{i}") for r in ranked if r.group in tied
                                             and r.votes == o.votes and abs(r.rel - o.rel) <= o.noise}),
                              "why": "their values are the same within rounding: given by the names' likeness to "
                                     "ours (the dump records no execution order to go by)"})
    tied_out: set = set()
    for o in ranked:  # matched by value to ops another name took: the same values twice, not another op
        if o.group not in assigned and o.group not in tied_out and o.ops & taken:
            tied_out.add(o.group)
            holders = sorted({shown(g) for g, (tm, mapped, _) in assigned.items()
                              if o.ops & {targets[j].op for j in mapped.values()}})
            ambiguous.append({"engine": [shown(o.group)] + holders, "ops": [o.template.replace("{}", "{i}")],
                              "why": f"the same values as {', '.join(holders)}, which took the op: left unmapped"})
    # 2. no layer matched by value: the free op of its shape its values are most like
    rest = sorted((o for o in options if o.group not in assigned and o.group not in tied_out and not o.ops & taken),
                  key=lambda o: (-o.cos, -like(o), o.cost, o.index, first(o.group)))
    alike_cache: dict = {}

    def alike(a: _Option, b: _Option) -> bool:  # ops holding the same values (within rounding) for these names
        key = (a.group, a.template, b.template)
        if key not in alike_cache:
            alike_cache[key] = all(i in b.mapped and same_values(targets[j], targets[b.mapped[i]], noise(i, j))
                                   for i, j in a.mapped.items())
        return alike_cache[key]

    extra_same: dict = {}
    by_group: dict = defaultdict(list)
    by_op: dict = defaultdict(list)
    for o in rest:
        by_group[o.group].append(o)
        for op in o.ops:
            by_op[op].append(o)
    anchored = bool(assigned)  # (some name matched an op by value: the shapes left have an order to go by)
    for o in rest:
        if o.group in assigned or o.group in tied_out or o.ops & taken or o.cos <= o.chance:
            continue  # (a cosine within 4 sigma of unrelated values': no likeness to go by)
        if not anchored:  # nothing in the dump is any op of ours: a likeness of shapes is no evidence
            continue
        rivals = {id(r): r for r in by_group[o.group] + [r for op in o.ops for r in by_op[op]]}.values()
        near = [r for r in rivals if r is not o and r.cos >= o.cos - o.noise and not r.ops & taken
                and r.group not in assigned]
        ties = [r for r in near if (r.group == o.group and not alike(o, r)) or (r.group != o.group and r.ops & o.ops)]
        if ties:
            tied_out.update([o.group] + [r.group for r in ties if r.ops & o.ops])
            ambiguous.append({"engine": sorted({shown(x) for x in [o.group] + [r.group for r in ties]}),
                              "ops": sorted({x.template.replace("{}", "{i}") for x in [o] + ties}),
                              "why": f"no layer matched by value; cosine {o.cos:.4f} against each within rounding: "
                                     "left unmapped (write the rule)"})
            continue
        assigned[o.group] = (o.template, o.mapped, "shape")
        taken |= o.ops
        for r in near:  # the ops holding the same values, said with it
            if r.group == o.group and alike(o, r):
                for i, j in r.mapped.items():
                    extra_same.setdefault(i, []).append(targets[j].op)
    if known_order:
        _follow_engine_order(assigned, groups, targets, first, rank)
    for g in sorted({o.group for o in rest} - set(assigned) - tied_out, key=shown):  # fits, but like none
        free = list(dict.fromkeys(o.template.replace("{}", "{i}") for o in sorted(
            (o for o in by_group[g] if not o.ops & taken), key=lambda o: (-like(o), o.index))))
        if free:
            tied_out.add(g)
            more = [f"(+{len(free) - 8})"] if len(free) > 8 else []
            ambiguous.append({"engine": [shown(g)], "ops": free[:8] + more,
                              "why": "no layer matched by value, and its values are like none of the free ops of its "
                                     "shape (non-finite, or unrelated): left unmapped" if anchored else
                                     "no tensor of the dump matched any op by value (wrong from the first op on: map "
                                     "once on a run the engine gets right, --write-map, and pass that --map)"})
    return _finish(names, parsed, groups, assigned, tied_out, targets, sc.pair, best, close, offset, ambiguous,
                   reason, extra_same, is_weight)


def _finish(names, parsed, groups, assigned, tied_out, targets, score, best, close, offset, ambiguous,
            reason, extra_same, is_weight) -> Proposal:
    matches: dict[str, Match] = {}
    rules: list[list[str]] = []

    def place(g):  # rules in program order (of their first op), then the unmapped
        return min((targets[j].index for j in assigned[g][1].values()), default=0) if g in assigned else math.inf

    for g, members in sorted(groups.items(), key=lambda kv: place(kv[0])):
        if g not in assigned:
            for i in members:
                matches[names[i]] = Match(names[i], None, "ambiguous" if g in tied_out else "none")
            continue
        tm, mapped, phase = assigned[g]
        p = parsed[names[members[0]]]
        general = p.slot is not None and offset == 0 and "{}" in tm  # (no arithmetic in a rule: one a name)
        shared = None
        if general and any(names[i] != targets[j].op for i, j in mapped.items()):
            rules.append([p.regex(), replacement(tm)])
            shared = len(rules) - 1
        for i in members:
            j = mapped.get(i)
            if j is None:  # (a layer we do not have)
                matches[names[i]] = Match(names[i], None, "none", rule=shared)
                continue
            rel, cos = score(i, j)[:2]
            how, k = ("value" if rel <= close else phase), shared
            if not general and names[i] != targets[j].op:
                rules.append(["^" + re.escape(names[i]) + "$", targets[j].op])
                k = len(rules) - 1
            same = sorted({targets[x].op for x in best.get(i, ()) if targets[x].op != targets[j].op}
                          | set(extra_same.get(i, ())),
                          key=lambda op: next(t.index for t in targets if t.op == op))
            matches[names[i]] = Match(names[i], targets[j].op, how, rel, cos, targets[j].last, k, same)
    if is_weight is not None:
        rules += weight_rules(matches, is_weight, len(rules))
        shown = defaultdict(list)  # (a rule's names as the ties show them: blk{i}.att_q)
        for n in names:
            shown[parsed[n].template().replace("{}", "{i}")].append(n)
        tied = [(a, [n for e in a["engine"] for n in shown.get(e, ())]) for a in ambiguous]
        ambiguous = [a for a, ns in tied if not (ns and all(matches[n].how == "weight" for n in ns))]  # (weights)
    taken = {m.op for m in matches.values() if m.op is not None}
    for n, m in matches.items():  # a name of ours left unmapped must not take an op given to another
        if m.op is None and n in taken:
            rules.append(["^" + re.escape(n) + "$", ""])
            m.rule = len(rules) - 1
    compiled = [(re.compile(rx), rep) for rx, rep in rules]  # (ours: literal text and (\d+) groups alone)

    def renamed(n: str) -> str:
        for rx, rep in compiled:
            n = rx.sub(rep, n)
        return n

    want = {n: (m.op if m.op is not None else n) for n, m in matches.items() if m.op is not None or m.rule is None}
    if any(renamed(n) != w for n, w in want.items()):
        # a rule's output is another rule's engine name: every rule marks its output, the last unmarks it
        rules = [[rx, ("auto:" + rep) if rep else rep] for rx, rep in rules] + [["^auto:", ""]]
    out = [matches[n] for n in names]
    return Proposal(out, rules, ambiguous, offset, reason)
