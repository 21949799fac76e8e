"""Name structure for names matched by value (workbench/diff/automap.py): an engine name's layer
digits, the rule its names generalise to, and its weights named its own way.

The digit runs of a name that vary among names otherwise alike are its layer (``blk3.att_q_proj``:
the ``3``); a name alone of its kind takes the layer digits where others of the same prefix have
them.  Names alike but for the layer form one rule: ``^blk(\\d+)\\.att_q_proj$``.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

_RUN = re.compile(r"\d+")


@dataclass
class Name:
    """An engine name cut at its digit runs, and which run (if any) is its layer."""

    name: str
    parts: tuple  # the literal text around the digit runs
    runs: tuple  # the digit runs
    slot: int | None = None  # which run is the layer

    @property
    def layer(self) -> int | None:
        return None if self.slot is None else int(self.runs[self.slot])

    @property
    def key(self) -> tuple:  # one rule's names: all but the layer digits alike
        if self.slot is None:
            return (self.name,)
        return (self.parts, self.slot, tuple(r for k, r in enumerate(self.runs) if k != self.slot))

    def regex(self) -> str:
        if self.slot is None:
            return "^" + re.escape(self.name) + "$"
        out = "^"
        for k, part in enumerate(self.parts):
            out += re.escape(part)
            if k < len(self.runs):
                out += r"(\d+)" if k == self.slot else self.runs[k]
        return out + "$"

    def template(self) -> str:  # the name with its layer digits as "{}"
        if self.slot is None:
            return self.name
        return "".join(part + (("{}" if k == self.slot else self.runs[k]) if k < len(self.runs) else "")
                       for k, part in enumerate(self.parts))

    def prefix(self, k: int) -> str:
        return "".join(self.parts[i] + ("#" if i < k else "") for i in range(k + 1))


def parse(names: Iterable[str]) -> dict[str, Name]:
    """Each name, its layer digits found: the run that varies most among names alike but for their
    digits (the first of equals), or, for a name alone of its kind, the run after a prefix others
    have their layer digits after."""
    parsed = {n: Name(n, tuple(_RUN.split(n)), tuple(_RUN.findall(n))) for n in names}
    groups: dict[tuple, list[Name]] = defaultdict(list)
    for p in parsed.values():
        groups[p.parts].append(p)
    prefixes = set()
    for parts, group in groups.items():
        distinct = [len({g.runs[k] for g in group}) for k in range(len(parts) - 1)]
        if max(distinct, default=1) > 1:
            slot = max(range(len(distinct)), key=lambda k: (distinct[k], -k))
            for g in group:
                g.slot = slot
            prefixes.add(group[0].prefix(slot))
    for p in parsed.values():  # a name alone of its kind (one layer dumped): its layer digits by their prefix
        if p.slot is None:
            p.slot = next((k for k in range(len(p.runs)) if p.prefix(k) in prefixes), None)
    return parsed


def replacement(template: str) -> str:
    """An op template (``layers.{}.mlp.act``) as a rule's replacement, the layer as group 1."""
    head, tail = template.split("{}", 1)
    return head + ("\\g<1>" if tail[:1].isdigit() else "\\1") + tail


def weight_rules(matches: dict, is_weight: Callable[[str], bool], start: int) -> list[list[str]]:
    """The rules for engine names no op took that name a checkpoint tensor once a prefix is cut (and
    ``.weight`` added): ``w.layers.0.mlp.down_proj`` -> ``layers.0.mlp.down_proj.weight``, by name
    (the diff then compares their values with the checkpoint's: a wrong dequantization is found
    there, not hidden here).  One rule for the most common prefix and suffix, where every name it
    would rename is such a weight; literal rules, before it, for the rest."""
    found = {}
    for n, m in matches.items():
        if m.op is None:
            for k in [0] + [k + 1 for k, ch in enumerate(n) if ch in "./:"]:  # (a prefix: `w.`, `model/`)
                suffix = next((x for x in ("", ".weight") if is_weight(n[k:] + x)), None)
                if suffix is not None:
                    found[n] = (n[:k], suffix)
                    break
    claims = Counter(n[len(p):] + x for n, (p, x) in found.items())
    found = {n: px for n, px in found.items() if claims[n[len(px[0]):] + px[1]] == 1}  # (one name a weight)
    if not found:
        return []
    (prefix, suffix), _ = Counter(found.values()).most_common(1)[0]
    general = prefix != "" and all(found.get(n) is not None for n, m in matches.items()
                                   if m.op is None and n.startswith(prefix))
    rules = []
    for n, (p, x) in found.items():
        m = matches[n]
        m.op, m.how = n[len(p):] + x, "weight"
        if (p, x) != (prefix, suffix) or not general:
            if m.op != n:
                rules.append(["^" + re.escape(n) + "$", m.op])
                m.rule = start + len(rules) - 1
    if general:
        rules.append(["^" + re.escape(prefix) + "(.+)$", "\\1" + suffix])
        for n, (p, x) in found.items():
            if (p, x) == (prefix, suffix):
                matches[n].rule = start + len(rules) - 1
    return rules
