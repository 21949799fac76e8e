"""Argument handling shared by `workbench dump` and `workbench diff`."""
from __future__ import annotations

import contextlib

from workbench.errors import UsageError, parse_ids
from workbench.diff.naming import RulesError
from workbench.diff.readers import DumpError
from workbench.diff.report import DiffError
from workbench.diff.engines import EngineError

DTYPES = ("float32", "float16", "bfloat16")


def add_input_arguments(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", metavar="TEXT", help="text, tokenized with the checkpoint's tokenizer")
    g.add_argument("--ids", metavar="1,2,3", help="token ids, comma-separated")


def add_dtype_argument(p) -> None:
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="compute dtype of the reference (default: the checkpoint's); values are dumped as float32")


def add_logits_argument(p, what: str) -> None:
    p.add_argument("--logits", default=None, metavar="all|last|START:STOP|P,P,...", help=what)


def parse_logits(args):
    """``--logits`` as ``trace(..., logits=)`` takes it (None when not given); a bad value is one line."""
    if args.logits is None:
        return None
    from workbench.trace.cli import parse_logits as parse  # the one parser, shared with hunt --logits

    return parse(args.logits)


def parse_input(args, required: bool = True):
    ids = parse_ids(args.ids) if args.ids is not None else None
    if required and ids is None and args.prompt is None:
        raise UsageError("give the input: --prompt TEXT or --ids 1,2,3")
    return ids, args.prompt


def _load_errors() -> tuple[type, ...]:
    """Error types our checkpoint loader raises for unusable checkpoints (if it defines them)."""
    out: list[type] = []
    for mod, name in (("workbench.checkpoint", "CheckpointError"), ("workbench.models", "ModelError"),
                      ("workbench.trace", "TraceError")):
        try:
            m = __import__(mod, fromlist=[name])
            t = getattr(m, name, None)
            if isinstance(t, type) and issubclass(t, Exception):
                out.append(t)
        except Exception:
            pass
    return tuple(out)


@contextlib.contextmanager
def usage_errors():
    try:
        yield
    except (DumpError, RulesError, DiffError, EngineError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
        raise UsageError(str(e)) from None
    except _load_errors() as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # anything else the input made impossible: one line, no traceback
        raise UsageError(str(e)) from None
