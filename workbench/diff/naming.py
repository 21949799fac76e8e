"""Mapping an engine's tensor names onto our op names.

A rules file is a JSON list of ``[regex, replacement]`` pairs.  They are applied in
order, each as a Python ``re.sub`` over the whole name, every rule seeing the result of
the one before, so rules compose::

    [["^blk\\\\.(\\\\d+)\\\\.", "layers.\\\\1."],
     ["attn_q$", "self_attn.q_proj"],
     ["^result_norm$", "norm"]]

Replacements take ``\\1`` / ``\\g<name>`` (Python) as well as ``$1`` / ``${1}`` (the
JavaScript/Rust/Swift style).  A name that comes out unchanged is used as it is, so an
engine that already uses our names needs no rules.  A replacement that yields an empty
name drops the tensor (it is listed as unmatched).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from workbench import fsio
from workbench.patterns import MAX_RULES, MAX_RULES_CHARS, Budget, PatternError, UserRegex

Rules = list[tuple[UserRegex, str]]


class RulesError(ValueError):
    """A rules file or rule that cannot be used."""


_DOLLAR = re.compile(r"\$(\d+)|\$\{(\w+)\}")


def _python_replacement(rep: str) -> str:
    return _DOLLAR.sub(lambda m: f"\\g<{m.group(1) or m.group(2)}>", rep)


def compile_rules(rules: Iterable[Sequence[str]] | None, where: str = "rules") -> Rules:
    out: Rules = []
    if rules is None:
        return out
    if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
        raise RulesError(f"{where}: expected a list of [regex, replacement] pairs")
    budget = Budget()  # every rule's matches share one time budget (patterns.TOTAL_BUDGET)
    chars = 0
    for i, rule in enumerate(rules):
        if i >= MAX_RULES:
            raise RulesError(f"{where}: more than {MAX_RULES} rules; an engine's names need far fewer "
                             "(one rule per naming pattern, with groups for the numbers)")
        if isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], UserRegex) and isinstance(rule[1], str):
            out.append(rule)  # compiled already
            continue
        if (not isinstance(rule, (list, tuple)) or len(rule) != 2
                or not all(isinstance(x, str) for x in rule)):
            raise RulesError(f"{where}: rule {i} is {rule!r}; each rule is a [regex, replacement] pair of strings")
        pat, rep = rule
        chars += len(pat) + len(rep)
        if chars > MAX_RULES_CHARS:
            raise RulesError(f"{where}: the rules up to rule {i} hold over {MAX_RULES_CHARS} characters; "
                             "write fewer, shorter rules")
        try:  # run under a time limit (catastrophic backtracking cannot hang the diff)
            rx = UserRegex(pat, f"{where}: rule {i}", budget=budget)
        except PatternError as e:
            raise RulesError(f"{where}: rule {i}: regex {pat!r} does not compile: {e.reason}") from None
        rep = _python_replacement(rep)
        try:  # check group references now, not on the first matching name
            _check_groups(rx, rep)
        except (re.error, IndexError) as e:
            raise RulesError(f"{where}: rule {i}: replacement {rule[1]!r}: {e}") from None
        out.append((rx, rep))
    return out


def _check_groups(rx: UserRegex, rep: str) -> None:
    for m in re.finditer(r"\\g<(\w+)>|\\(\d+)", rep):
        g = m.group(1) or m.group(2)
        if g.isdigit():
            if int(g) > rx.groups:
                raise re.error(f"refers to group {g}, but the regex has {rx.groups}")
        elif g not in rx.groupindex:
            raise re.error(f"refers to group {g!r}, which the regex does not define")


def load_rules(path: str | os.PathLike) -> Rules:
    p = Path(path)
    try:  # a regular file of bounded size only (a FIFO or /dev/zero is refused by name)
        data = fsio.read_json(p, fsio.MAX_RULES)
    except fsio.InputFileError as e:
        raise RulesError(str(e)) from None
    if isinstance(data, dict) and "rules" in data:
        data = data["rules"]
    return compile_rules(data, where=str(p))


def apply_rules(name: str, rules: Rules) -> str:
    for rx, rep in rules:
        try:
            name = rx.sub(rep, name)
        except PatternError as e:
            raise RulesError(str(e)) from None
    return name
