"""`stagec compile`, `run`, `tune` and `codesign`: a model from the shell to a program, its outputs,
its mappings or a co-designed config.  The parsers are built here without torch or JAX; each
command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import contextlib
import warnings
from pathlib import Path

from stagec.errors import InputError

from . import cli_args

MISSED = 3   # the exit status of a program that misses a latency or power target


def _compile(args) -> int:
    import stagec
    from stagec.errors import TargetWarning

    from .report import make_report
    from .tuning import Tuning
    hw = cli_args.hardware(args.hw)
    if args.calibration and args.quantize != "int8":
        raise InputError("--calibration needs --quantize int8")
    if args.quantize is None and "fp32" not in hw.dtypes:
        raise InputError(f"--hw {args.hw} computes in {'/'.join(hw.dtypes)} only: add --quantize int8 (or bf16)")
    model, example, kwargs = cli_args.model(args.model, args.reduced)
    mappings = Tuning.load(args.mappings).mappings if args.mappings else None
    dump = None if args.dump is None else True if args.dump == "all" else args.dump.split(",")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TargetWarning)   # the verdict below says it, with the slack
        program = stagec.compile(
            model, example, hw=hw, kwargs=kwargs, dump=dump, mappings=mappings, objective=OPTIMISE[args.optimise],
            tune="gradient" if args.tune else None, quantize=args.quantize,
            calibration=cli_args.calibration(args.calibration) if args.calibration else None,
            latency_target_s=args.latency_target, power_budget_w=args.power_budget, progress=not args.quiet,
            fuse_layers=not args.no_fusion)
    program.save(args.output)
    if args.stablehlo:
        from .exports import stablehlo_text
        Path(args.stablehlo).write_text(stablehlo_text(model, example, kwargs))
    report = program.cache.get("report") or make_report(program)
    print(report.summary())
    print(verdict_line(report, f"wrote {args.output} ({len(program)} instructions)"))
    return 0 if report.verdict is None or report.verdict.met else MISSED


def verdict_line(report, done: str) -> str:
    watts = sum(report.energy_pj.values()) * 1e-12 / report.latency_s if report.latency_s else 0.0
    head = f"{done}: {report.latency_s * 1e3:.4g} ms, {watts * 1e3:.4g} mW"
    v = report.verdict
    if v is None:
        return f"verdict: {head}; no latency or power target given"
    missed = [c for c in v.checks if not c.met]
    return (f"verdict: {'MISSED' if missed else 'met'} ({head}); "
            + "; ".join(f"{c.name} slack {c.slack * 1e3:+.4g} {'ms' if c.unit == 's' else 'mW'}" for c in v.checks))


def _run(args) -> int:
    import numpy as np

    import stagec
    program = stagec.load(args.program)
    outputs, report = stagec.simulate(program, *cli_args.arrays(args.input))
    arrays = [np.asarray(a) for a in cli_args.leaves(outputs)]
    out = Path(args.output)
    paths = [out] if len(arrays) == 1 else [out.with_name(f"{out.stem}.{k}{out.suffix or '.npy'}")
                                            for k in range(len(arrays))]
    for path, a in zip(paths, arrays, strict=True):
        np.save(path, a)
    from .exports import write_report
    written = [*paths, *(write_report(report, args.report) if args.report else [])]
    if not args.quiet:
        print(report.summary())
    print(verdict_line(report, "simulated") + "\nwrote " + ", ".join(map(str, written)))
    return 0 if report.verdict is None or report.verdict.met else MISSED


def _tune(args) -> int:
    import stagec
    from stagec.costmodel.tuner import print_progress
    model, example, kwargs = cli_args.model(args.model, args.reduced)
    settings = stagec.TuneSettings(**({"steps": args.steps, "chunk": min(args.steps, 30)} if args.steps else {}))
    tuning = stagec.tune(model, example, cli_args.hardware(args.hw), args.objective, kwargs, settings,
                         progress=None if args.quiet else print_progress, quantize=args.quantize,
                         calibration=cli_args.calibration(args.calibration) if args.calibration else None)
    tuning.save(args.output)
    print(f"{tuning}\nwrote {args.output}")
    return 0


def _codesign(args) -> int:
    import stagec
    from stagec.costmodel.codesign import DEFAULT_CODESIGN

    from .targets import Targets, verdict
    settings = DEFAULT_CODESIGN.__class__(steps=args.steps) if args.steps else DEFAULT_CODESIGN
    tune_settings = stagec.TuneSettings(steps=args.steps, chunk=min(args.steps, 30)) if args.steps else \
        stagec.TuneSettings()
    models = [cli_args.model(spec, args.reduced) for spec in args.models]
    result = stagec.codesign(models, args.area_budget, args.objective, args.power_budget, args.latency_target,
                             settings=settings, tune_settings=tune_settings, progress=not args.quiet,
                             fusion=not args.no_fusion)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.hw.save(out / "hw.yaml")
    from .exports import write_report
    targets, status = Targets(args.latency_target, args.power_budget, ("co-design",)), 0
    print(result)
    for spec, report in zip(args.models, result.reports, strict=True):
        name = Path(spec).stem.replace(":", "_")
        if targets:
            from dataclasses import replace
            report = replace(report, verdict=verdict(report, targets))
            status = status or (0 if report.verdict.met else MISSED)
        write_report(report, out / name)
        print(verdict_line(report, name))
    from .sweeps import SweepResults
    front = SweepResults(list(result.scored))
    for suffix in ("png", "svg"):
        front.figure().savefig(out / f"pareto.{suffix}")
    (out / "pareto.txt").write_text(front.pareto_table() + "\n")
    print(f"wrote {out / 'hw.yaml'}, each model's report and the exact model's Pareto fronts (pareto.png, .svg, "
          f".txt) of the configs it scored under {out}")
    return status


# --optimise: what the mappers minimize (compile's objective)
OPTIMISE = {"performance": "latency", "size": "size", "energy": "energy", "edp": "edp"}


def add_commands(command) -> None:
    """The commands' parsers, through cli.py's `command(name, run, help, example)`."""
    c = command("compile", _compile, "compile a model to a program file, print its per-layer summary and verdict",
                "stagec compile resnet18 --reduced --hw wearable --quantize int8 --latency-target 5ms -o model.stgc")
    _model_arguments(c)
    c.add_argument("-o", "--output", required=True, help="the program file to write (.stgc)")
    c.add_argument("--stablehlo", metavar="FILE", help="also write the traced graph as StableHLO text (jax.export)")
    c.add_argument("--tune", action="store_true", help="map the layers with the gradient tuner (stagec.tune)")
    c.add_argument("--mappings", help="mappings.json from `stagec tune` (layers it names are mapped so)")
    c.add_argument("--dump", metavar="STAGES", help="print these stages' products: comma-separated names "
                                                    "(jaxpr,graph,...,schedule,program) or 'all'")
    c.add_argument("--optimise", "--optimize", choices=tuple(OPTIMISE), default="performance",
                   help="performance (default): minimize latency; size: cycles x scratchpad and accumulator "
                        "footprint (peak SRAM, in the report); energy; edp (energy x delay, the library's default)")
    c.add_argument("--latency-target", type=cli_args.seconds, metavar="TIME", help="e.g. 5ms (units s, ms, us, ns)")
    _no_fusion(c, "layer by layer, every activation through DRAM (default: layers fused into cascades)")
    c.add_argument("--power-budget", type=cli_args.watts, metavar="W", help="average watts, e.g. 0.1 or 100mW")
    r = command("run", _run, "simulate a program on input arrays, write its outputs and report",
                "stagec run model.stgc --input x.npy --output y.npy --report report/")
    r.add_argument("program", help="a program file (stagec compile -o)")
    r.add_argument("--input", action="append", required=True, metavar="X.npy",
                   help="a positional input, as .npy (repeat for several, in order)")
    r.add_argument("--output", required=True, metavar="Y.npy",
                   help="where to write the output (several outputs: Y.0.npy, Y.1.npy, ...)")
    r.add_argument("--report", metavar="DIR", help="also write summary.txt, report.json, layers.csv and trace.json "
                                                   "(open it in ui.perfetto.dev) there")
    _quiet(r)
    t = command("tune", _tune, "tune a model's mappings by gradient on the cost model; write them as JSON",
                "stagec tune resnet18 --reduced --hw gemmini --quantize int8 -o mappings.json\n"
                "  stagec compile resnet18 --reduced --hw gemmini --quantize int8 --mappings mappings.json -o m.stgc")
    _model_arguments(t)
    t.add_argument("-o", "--output", required=True, help="mappings.json to write")
    t.add_argument("--objective", choices=("latency", "energy", "edp"), default="edp", help="default: edp")
    t.add_argument("--steps", type=_positive, help="adam steps (default: TuneSettings')")
    d = command("codesign", _codesign, "co-design a buildable accelerator for models within an area budget",
                "stagec codesign resnet18 mobilenet_v2 --reduced --area-budget 2.0 --objective edp --out codesign/")
    d.add_argument("models", nargs="+", metavar="MODEL", help=MODEL_HELP)
    d.add_argument("--reduced", action="store_true", help="zoo models' small configurations")
    d.add_argument("--area-budget", type=float, required=True, metavar="MM2", help="mm^2")
    d.add_argument("--power-budget", type=cli_args.watts, metavar="W", help="average watts, confirmed by the simulator")
    d.add_argument("--latency-target", type=cli_args.seconds, metavar="TIME",
                   help="every model's, a constraint of the search, confirmed by the simulator")
    d.add_argument("--objective", choices=("latency", "energy", "edp"), default="latency")
    d.add_argument("--out", required=True, metavar="DIR",
                   help="hw.yaml, one report folder per model, pareto.png/.svg/.txt of the configs scored")
    d.add_argument("--steps", type=_positive, help="descent and tuning steps (default: the settings')")
    _no_fusion(d, "price and compile every config layer by layer (default: with its layers fused into cascades)")
    _quiet(d)


MODEL_HELP = ("a zoo model (e.g. resnet18), path/to/file.py:factory (factory() returns (model, args) or "
              "(model, args, kwargs)), or a torch.export program saved with torch.export.save (.pt2)")


def _model_arguments(p) -> None:
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--reduced", action="store_true", help="the zoo model's small configuration")
    p.add_argument("--hw", metavar="PRESET|FILE", help="a preset (stagec hw list) or a config file; default: default")
    p.add_argument("--quantize", choices=("int8", "bf16"), help="precision (default: fp32)")
    p.add_argument("--calibration", metavar="DIR", help="int8: a folder of .npy batches (NAME.npy per batch of a "
                                                        "single-input model; NAME.0.npy, NAME.1.npy, ... for several)")
    _quiet(p)


def _no_fusion(p, help_text: str) -> None:
    p.add_argument("--no-fusion", action="store_true", help=help_text)


def _quiet(p) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def _positive(text: str) -> int:
    with contextlib.suppress(ValueError):
        if int(text) > 0:
            return int(text)
    raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
