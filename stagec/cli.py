"""The `stagec` command line.

A user's mistake (a missing or unreadable file, a file that is not a program or config, a model
stagec cannot compile, a factory that fails) prints one line, `stagec <command>: <what is wrong>`,
and exits non-zero; `--debug` shows the traceback instead.  Anything else is a bug, and shows
its traceback.
"""

from __future__ import annotations

import argparse
import sys

from stagec.errors import InputError, StagecError

from . import cli_compile, cli_hw

EPILOG = """\
exit status: 0 on success; 1 when a file, config or model cannot be used (one line on stderr;
`ops` also exits 1 when the model has an unsupported op); 2 for a usage or argument error;
3 when a program misses its latency or power target (compile, run, codesign: the slack is printed).
--debug (before or after the command) shows the traceback of an error instead of one line."""

# The errors that are the user's to fix: one line each, not a traceback.
USER_ERRORS = (StagecError, OSError)


def _demo(args) -> int:
    from .cli_args import hardware
    from .demo import run_demo
    return 0 if run_demo(hardware(args.hw), args.precision) else 1


def _disasm(args) -> int:
    from stagec.isa import disassemble

    from .program_file import load
    sys.stdout.write(disassemble(load(args.program)))
    return 0


def _report(args) -> int:
    from .report_cli import run_report
    run_report(args.program, args.hw, args.out, args.precision)
    return 0


def _ops(args) -> int:
    from stagec.frontend import coverage, format_coverage

    from .zoo import load_example
    rows = coverage(*load_example(args.model, args.reduced))
    sys.stdout.write(format_coverage(rows))
    return 0 if all(row.supported for row in rows) else 1


def _parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error instead of one line")
    parser = argparse.ArgumentParser(prog="stagec", description="stagec: compile PyTorch models for edge accelerators",
                                     epilog=EPILOG, parents=[debug],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help: str, example: str | None = None) -> argparse.ArgumentParser:  # noqa: A002
        p = sub.add_parser(name, help=help, description=help, parents=[debug],
                           epilog=(f"example:\n  {example}\n\n" if example else "") + EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(run=run)
        return p

    demo = command("demo", _demo, "compile and simulate the bundled hand-keypoint network")
    demo.add_argument("--hw", help="a preset (stagec hw list) or a config file (YAML or JSON); default: default")
    demo.add_argument("--precision", choices=("int8", "bf16", "fp32"), default="int8",
                      help="int8 (default: calibrated, shown beside bf16 and fp32), bf16 (beside fp32) or fp32 "
                           "alone (fastest)")
    dis = command("disasm", _disasm, "print a saved program as assembly")
    dis.add_argument("program")
    rep = command("report", _report, "time a program and write its report (table, JSON) and plots (PNG, SVG)")
    rep.add_argument("program", nargs="?", help="a saved program; default: the bundled hand-keypoint network")
    rep.add_argument("--hw", help="hardware config (YAML or JSON) to compile the demo for")
    rep.add_argument("--out", default="stagec-report", help="output folder (default: ./stagec-report)")
    rep.add_argument("--precision", choices=("int8", "bf16", "fp32"), default="int8",
                     help="the demo model's precision (int8, the default, and bf16 are also compared with fp32)")
    ops = command("ops", _ops, "a model's ATen ops, with counts and whether stagec supports each "
                               "(exit status 1 if any is unsupported)")
    ops.add_argument("model", help="a zoo model (stagec.zoo.ZOO, e.g. resnet18) or path/to/file.py:factory, "
                                   "where factory() returns (model, args) or (model, args, kwargs)")
    ops.add_argument("--reduced", action="store_true", help="the zoo model's small configuration")
    cli_compile.add_commands(command)
    cli_hw.add_commands(command)
    from .cli_sweep import add_sweep_command
    add_sweep_command(sub, parents=[debug])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except USER_ERRORS as e:
        if getattr(args, "debug", False):
            raise
        print(f"stagec {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2 if isinstance(e, InputError) else 1


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    raise SystemExit(main())
