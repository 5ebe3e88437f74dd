"""The `stagec` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stagec", description="stagec: compile PyTorch models for edge accelerators")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile and simulate the bundled hand-keypoint network")
    demo.add_argument("--hw", help="hardware config (YAML or JSON); default: the built-in edge accelerator")
    demo.add_argument("--precision", choices=("int8", "fp32"), default="int8",
                      help="int8 (default: calibrated, shown beside fp32) or fp32 alone (faster)")
    dis = sub.add_parser("disasm", help="print a saved program as assembly")
    dis.add_argument("program")
    rep = sub.add_parser("report", help="time a program and write its report (table, JSON) and plots (PNG, SVG)")
    rep.add_argument("program", nargs="?", help="a saved program; default: the bundled hand-keypoint network")
    rep.add_argument("--hw", help="hardware config (YAML or JSON) to compile the demo for")
    rep.add_argument("--out", default="stagec-report", help="output folder (default: ./stagec-report)")
    rep.add_argument("--precision", choices=("int8", "fp32"), default="int8",
                     help="the demo model's precision (int8, the default, is also compared with fp32)")
    ops = sub.add_parser("ops", help="a model's ATen ops, with counts and whether stagec supports each "
                                     "(exit status 1 if any is unsupported)")
    ops.add_argument("model", help="a zoo model (stagec.zoo.ZOO, e.g. resnet18) or path/to/file.py:factory, "
                                   "where factory() returns (model, args) or (model, args, kwargs)")
    ops.add_argument("--reduced", action="store_true", help="the zoo model's small configuration")
    args = parser.parse_args(argv)
    if args.command == "ops":
        from stagec.frontend import ExportError, coverage, format_coverage

        from .zoo import load_example
        try:
            rows = coverage(*load_example(args.model, args.reduced))
        except (ValueError, FileNotFoundError, ExportError) as e:
            parser.exit(2, f"stagec ops: {e}\n")
        sys.stdout.write(format_coverage(rows))
        return 0 if all(row.supported for row in rows) else 1

    from stagec.isa import HardwareConfig
    if args.command == "demo":
        from .demo import run_demo
        return 0 if run_demo(HardwareConfig.load(args.hw) if args.hw else None, args.precision) else 1
    if args.command == "disasm":
        from stagec.isa import disassemble

        from .api import load
        sys.stdout.write(disassemble(load(args.program)))
    if args.command == "report":
        from .report_cli import run_report
        run_report(args.program, args.hw, args.out, args.precision)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
