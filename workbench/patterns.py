"""Users' regular expressions (``--ops re:...``, ``--map`` rules), run under a time limit.

A pattern with catastrophic backtracking must not run for minutes: every match runs on
the ``regex`` engine (the syntax of Python's ``re``) with a per-call timeout, and a
pattern also has a total time budget; either running out raises :class:`PatternError`
(a ValueError: one line, exit 2 on the command line) naming the pattern.  An invalid
pattern raises it too, at compile time.

Compiling is bounded too: the engine unrolls counted repeats (``a{1000000000}`` grows to
gigabytes while compiling), so before compiling, every repeat count is at most
:data:`MAX_REPEAT` and the pattern's unrolled size (each repeat count times what it repeats,
nested repeats multiplied) at most :data:`MAX_UNROLLED`.  A list of rules (``--map``) holds
at most :data:`MAX_RULES` rules of :data:`MAX_RULES_CHARS` characters in all, and all its
matches share one :class:`Budget` of :data:`TOTAL_BUDGET` seconds.
"""
from __future__ import annotations

import functools
import time

import regex as _regex

#: seconds one match may take, and all matches of one compiled pattern together
CALL_TIMEOUT = 0.5
TOTAL_BUDGET = 10.0
MAX_LENGTH = 10_000
#: the largest count of one repeat (``{n}``, ``{n,m}``), and of the unrolled pattern
MAX_REPEAT = 10_000
MAX_UNROLLED = 100_000
#: a rule list's size: rules, and characters of all their patterns together
MAX_RULES = 1_000
MAX_RULES_CHARS = 200_000


class Budget:
    """Seconds of matching that several patterns share (every rule of one ``--map`` list)."""

    def __init__(self, seconds: float = None):
        self.total = TOTAL_BUDGET if seconds is None else float(seconds)
        self.spent = 0.0


class PatternError(ValueError):
    """An invalid regular expression, or one that ran past its time limit."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


_QUANT = _regex.compile(r"\{(\d*)(?:(,)(\d*))?\}")
_BRACED_ESCAPES = set("xuUNpPgk")


def unrolled_size(pattern: str, where: str = "regex") -> int:
    """How many atoms ``pattern`` unrolls to once its counted repeats are expanded (nested
    repeats multiplied; ``*``, ``+``, ``?`` count once); a PatternError (one line) as soon as
    one count passes MAX_REPEAT or the whole passes MAX_UNROLLED.  A linear scan: escapes
    and character classes are one atom each, a ``{`` that is no repeat a literal."""
    frames = [[0, 0]]  # per open group: [size so far, size of the last atom]
    i, n = 0, len(pattern)

    def atom(w):
        frames[-1][0] += w
        frames[-1][1] = w

    while i < n:
        c = pattern[i]
        if c == "\\":
            j = i + 2
            if i + 1 < n and pattern[i + 1] in _BRACED_ESCAPES and j < n and pattern[j] == "{":
                k = pattern.find("}", j)
                j = n if k < 0 else k + 1
            i = j
            atom(1)
            continue
        if c == "[":  # a class: up to its closing bracket (one given first, or escaped, is literal)
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            depth = 1
            while j < n and depth:
                if pattern[j] == "\\":
                    j += 2
                    continue
                if pattern[j] == "[" and j + 1 < n and pattern[j + 1] in ":=.":  # [:alpha:]
                    k = pattern.find(pattern[j + 1] + "]", j + 2)
                    j = n if k < 0 else k + 2
                    continue
                if pattern[j] == "]":
                    depth -= 1
                j += 1
            i = j
            atom(1)
            continue
        if c == "(":
            frames.append([0, 0])
            i += 1
            continue
        if c == ")" and len(frames) > 1:
            w = frames.pop()[0]
            atom(max(w, 1))
            i += 1
            continue
        if c == "{":
            m = _QUANT.match(pattern, i)
            if m and (m.group(1) or m.group(3)):
                counts = [int(x) for x in (m.group(1), m.group(3)) if x and len(x) <= 12]
                if len(counts) < len([x for x in (m.group(1), m.group(3)) if x]) or max(counts) > MAX_REPEAT:
                    big = max(m.group(1) or "0", m.group(3) or "0", key=lambda x: (len(x), x))
                    why = f"repeat count {_short(big, 20)} is over the limit of {MAX_REPEAT}"
                    raise PatternError(f"{where}: regex {_short(pattern)}: {why}", why)
                k = max(counts)
                f = frames[-1]
                f[0] += f[1] * (k - 1)
                f[1] *= k
                i = m.end()
                if f[0] > MAX_UNROLLED:
                    break
                continue
        atom(1)
        i += 1
        if frames[-1][0] > MAX_UNROLLED:
            break
    total = sum(f[0] for f in frames)
    if total > MAX_UNROLLED:
        why = f"it unrolls its repeats to over {MAX_UNROLLED} characters; use * or + instead of a large count"
        raise PatternError(f"{where}: regex {_short(pattern)}: {why}", why)
    return total


def _short(s: str, limit: int = 60) -> str:
    return repr(s) if len(s) <= limit else repr(s[:limit]) + f"... ({len(s)} characters)"


class UserRegex:
    """A compiled user pattern with ``fullmatch`` / ``search`` / ``sub`` under time limits
    (its own :class:`Budget`, or one it shares with other rules of a list)."""

    def __init__(self, pattern: str, where: str = "regex", budget: Budget | None = None):
        if not isinstance(pattern, str):
            raise PatternError(f"{where}: {pattern!r} is not a string")
        if len(pattern) > MAX_LENGTH:
            raise PatternError(f"{where}: the regex is {len(pattern)} characters long (limit {MAX_LENGTH})")
        unrolled_size(pattern, where)
        try:
            self._rx = _regex.compile(pattern)
        except (_regex.error, ValueError, TypeError, OverflowError, RecursionError) as e:
            raise PatternError(f"{where}: {pattern!r} is not a valid regular expression ({e})", str(e)) from None
        self.pattern, self.where = pattern, where
        self.groups, self.groupindex = self._rx.groups, self._rx.groupindex
        self.budget = budget if budget is not None else Budget()
        self.shared = budget is not None

    @property
    def spent(self) -> float:
        return self.budget.spent

    def _run(self, fn, *args):
        b = self.budget
        left = b.total - b.spent
        how = "in total" + (" (all rules together)" if self.shared else "")
        if left <= 0:
            raise self._timeout(b.total, how)
        limit = min(CALL_TIMEOUT, left)
        t = time.perf_counter()
        try:
            return fn(*args, timeout=limit)
        except TimeoutError:
            raise self._timeout(limit, "on one name" if limit == CALL_TIMEOUT else how) from None
        except (_regex.error, IndexError) as e:  # a bad group reference in a replacement
            raise PatternError(f"{self.where}: {self.pattern!r}: {e}") from None
        finally:
            b.spent += time.perf_counter() - t

    def _timeout(self, limit, how) -> PatternError:
        return PatternError(f"{self.where}: regex {_short(self.pattern)} ran longer than {limit:g} s {how} "
                            "(catastrophic backtracking?); simplify it")

    def fullmatch(self, s: str):
        return self._run(self._rx.fullmatch, s)

    def search(self, s: str):
        return self._run(self._rx.search, s)

    def sub(self, repl: str, s: str) -> str:
        return self._run(self._rx.sub, repl, s)


@functools.lru_cache(maxsize=256)
def compiled(pattern: str, where: str = "regex") -> UserRegex:
    """A cached :class:`UserRegex` (for patterns matched against many names)."""
    return UserRegex(pattern, where)
