"""Users' regular expressions (``--ops re:...``, ``--map`` rules), run under a time limit.

A pattern with catastrophic backtracking must not run for minutes: every match runs on
the ``regex`` engine (the syntax of Python's ``re``) with a per-call timeout, and a
pattern also has a total time budget; either running out raises :class:`PatternError`
(a ValueError: one line, exit 2 on the command line) naming the pattern.  An invalid
pattern raises it too, at compile time.
"""
from __future__ import annotations

import functools
import time

import regex as _regex

#: seconds one match may take, and all matches of one compiled pattern together
CALL_TIMEOUT = 0.5
TOTAL_BUDGET = 10.0
MAX_LENGTH = 10_000


class PatternError(ValueError):
    """An invalid regular expression, or one that ran past its time limit."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class UserRegex:
    """A compiled user pattern with ``fullmatch`` / ``search`` / ``sub`` under time limits."""

    def __init__(self, pattern: str, where: str = "regex"):
        if not isinstance(pattern, str):
            raise PatternError(f"{where}: {pattern!r} is not a string")
        if len(pattern) > MAX_LENGTH:
            raise PatternError(f"{where}: the regex is {len(pattern)} characters long (limit {MAX_LENGTH})")
        try:
            self._rx = _regex.compile(pattern)
        except (_regex.error, ValueError, TypeError, OverflowError, RecursionError) as e:
            raise PatternError(f"{where}: {pattern!r} is not a valid regular expression ({e})", str(e)) from None
        self.pattern, self.where = pattern, where
        self.groups, self.groupindex = self._rx.groups, self._rx.groupindex
        self.spent = 0.0

    def _run(self, fn, *args):
        left = TOTAL_BUDGET - self.spent
        if left <= 0:
            raise self._timeout(TOTAL_BUDGET, "in total")
        limit = min(CALL_TIMEOUT, left)
        t = time.perf_counter()
        try:
            return fn(*args, timeout=limit)
        except TimeoutError:
            raise self._timeout(limit, "on one name" if limit == CALL_TIMEOUT else "in total") from None
        except (_regex.error, IndexError) as e:  # a bad group reference in a replacement
            raise PatternError(f"{self.where}: {self.pattern!r}: {e}") from None
        finally:
            self.spent += time.perf_counter() - t

    def _timeout(self, limit, how) -> PatternError:
        return PatternError(f"{self.where}: regex {self.pattern!r} ran longer than {limit:g} s {how} "
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
