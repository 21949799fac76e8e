"""The `workbench` command line.

Every command has ``--json`` and exits 0 when clean, 1 when it found problems, 2 when
its input is unusable (one clear line on stderr, never a traceback).  Each command lives
in its own module, exposing ``add_arguments(parser)`` and ``run(args) -> int``; register
it in COMMANDS below.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings

import workbench  # noqa: F401  (fast BLAS before mlx.core)
from workbench.errors import UsageError, parse_ids  # noqa: F401  (re-exported: `from workbench.cli import UsageError`)

#: command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("workbench.checkpoint.cli", "check a checkpoint against its config: missing/misnamed tensors, shapes, quantization, files"),
    "hazards": ("workbench.buffers.cli", "check a recorded dispatch schedule for buffer aliasing hazards"),
    "lab": ("workbench.lab", "open JupyterLab on the workbench notebooks"),
    "demo": ("workbench.demo.command", "the embedded demo model: where it is, a greedy generation, --eval accuracy, --heads"),
    "dump": ("workbench.diff.cli_dump", "write the reference's activations (float32, by op name) to safetensors"),
    "diff": ("workbench.diff.cli_diff", "compare an engine's activation dump with the reference: first divergence"),
    "hunt": ("workbench.trace.cli", "find the first op whose output holds NaN or Inf, and why (overflow, invalid, bad weight, bad input)"),
    "cache-check": ("workbench.trace.cli_cache_check", "prefill(T-1) + decode(1) through the KV cache vs one forward: the first layer that differs"),
    "distributed": ("workbench.distributed.cli", "trace a checkpoint split by layers across the processes mlx.launch started (per-op statistics gathered to rank 0)"),
}


class OneLineParser(argparse.ArgumentParser):
    """An argument error is one line on stderr (``workbench CMD: argument --x: ...``) and
    exit status 2, with no usage dump; ``--help`` still prints the usage."""

    def error(self, message):
        from workbench.errors import printable

        text = " ".join(str(message).split())
        self.exit(2, printable(f"{self.prog}: {text} (--help: usage)") + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="workbench", description="See inside transformer language models while they run.")
    p.add_argument("--version", action="version", version=f"workbench {workbench.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, help_) in COMMANDS.items():
        mod = importlib.import_module(modname)
        sp = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip().splitlines()[0])
        mod.add_arguments(sp)
        sp.set_defaults(_module=mod)
    return p


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.split("\n")[0] if text else type(e).__name__  # (a \r or escape in it is escaped by main)


def main(argv: list[str] | None = None) -> int:
    from workbench.fsio import InputFileError, WriteError
    from workbench.patterns import PatternError

    if not sys.warnoptions:  # findings are reported by us, in one line; no library warnings on stderr
        warnings.simplefilter("ignore")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # an argument error (one line printed, 2), --help or --version (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args) or 0)
    except (UsageError, InputFileError, WriteError, PatternError, MemoryError) as e:
        msg = _one_line(e) if not isinstance(e, MemoryError) else \
            f"out of memory ({_one_line(e)}): the input asks for more than this machine has"
        from workbench.errors import printable

        msg = printable(msg)  # a name from a file holding a newline or escape stays one inert line
        if getattr(args, "json", False):
            print(json.dumps({"error": msg}))
        print(f"workbench {args.command}: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `workbench inspect ... | head`: the reader went away; not an error of ours
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    from workbench.child import drop_working_directory

    drop_working_directory()  # (`python -m workbench.cli` put it first: no later import comes from there)
    sys.exit(main())
