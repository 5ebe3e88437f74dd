"""`stagec sweep`: stagec.sweep from the command line.

    stagec sweep mobilenet_v2 --reduced --hw array_rows=8,16,32 --hw scratchpad_bytes=65536:524288:65536 \\
        --quantize none,int8 --out sweep.jsonl --plot pareto.png

Each --hw is FIELD=V1,V2,... (a list) or FIELD=LO:HI[:STEP] (a stagec.sweeps.Range); with --samples
the space is sampled.  Prints the area-latency Pareto front; --plot draws both fronts.
"""

from __future__ import annotations

import argparse

from stagec.errors import InputError

EXAMPLE = "e.g. --hw array_rows=8,16,32 or --hw scratchpad_bytes=65536:524288:65536"


def add_sweep_command(subparsers, parents=()) -> argparse.ArgumentParser:
    """The `sweep` subcommand on `subparsers` (the CLI's)."""
    p = subparsers.add_parser("sweep", parents=list(parents), help="sweep hardware configs x models x options, "
                              "simulated (or predicted), as Ray tasks or in one process",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(run=_sweep)
    p.add_argument("models", nargs="+", help="zoo models (stagec.zoo.ZOO) or path/to/file.py:factory")
    p.add_argument("--hw", action="append", default=[], metavar="FIELD=VALUES",
                   help=f"a hardware field's values (repeatable; {EXAMPLE})")
    p.add_argument("--samples", type=int, help="random configs drawn from the space instead of its whole grid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantize", default="none", help="comma-separated: none, int8, bf16 (default none)")
    p.add_argument("--objective", default="edp", help="comma-separated: latency, energy, edp (default edp)")
    p.add_argument("--tune", action="store_true", help="mappings by stagec.tune at every point (slow)")
    p.add_argument("--mode", choices=("simulate", "costmodel"), default="simulate")
    p.add_argument("--executor", choices=("ray", "local"), help="default: ray when installed, else local")
    p.add_argument("--address", help="a running Ray cluster (default: RAY_ADDRESS, else a local instance)")
    p.add_argument("--workers", type=int, help="CPUs of a local Ray instance (default: all)")
    p.add_argument("--reduced", action="store_true", help="the zoo models' small configurations")
    p.add_argument("--out", default="sweep.jsonl", help="results file, JSON lines (resumed if it exists)")
    p.add_argument("--plot", help="write the Pareto fronts (area and energy vs latency) to this image")
    return p


def parse_space(items: list[str]) -> dict:
    """FIELD=VALUES items as a sweep's hardware space."""
    from .sweeps import Range

    space = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise InputError(f"--hw {item!r}: expected FIELD=VALUES ({EXAMPLE})")
        parts = values.split(":")
        if len(parts) in (2, 3):
            space[name] = Range(*(_number(v, item) for v in parts))
        else:
            space[name] = [_value(v) for v in values.split(",")]
    return space


def _sweep(args) -> int:
    from .sweeps import sweep
    from .zoo import ZOO, load_example

    models = {m: (m if m in ZOO else load_example(m)) for m in args.models}
    options = {"quantize": [None if q == "none" else q for q in args.quantize.split(",")],
               "objective": args.objective.split(","), "tune": args.tune}
    results = sweep(models, parse_space(args.hw), options=options, samples=args.samples, seed=args.seed,
                    mode=args.mode, out=args.out, executor=args.executor, address=args.address,
                    workers=args.workers, reduced=args.reduced)
    failed = len(results.rows) - len(results.ok())
    print(f"{len(results.rows)} points ({results.computed} computed now, {failed} failed) in {results.path}")
    print(results.pareto_table("area_mm2", "latency_s"))
    if args.plot:
        results.figure().savefig(args.plot, dpi=130)
        print(f"wrote {args.plot}")
    return 0


def _value(text: str):
    try:
        return _number(text, text)
    except InputError:
        return text


def _number(text: str, item: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise InputError(f"--hw {item!r}: {text!r} is not a number ({EXAMPLE})")
