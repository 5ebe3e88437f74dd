"""A fuzzing campaign: random models (fp32 and int8) on random hardware against PyTorch eager and
the int8 reference, in worker processes, with a time limit per case.

    python experiments/fuzz_campaign.py [--cases 200] [--first-seed 0] [--workers 2] [--timeout 120]
                                        [--out experiments/results/fuzz_campaign.json]
    python experiments/fuzz_campaign.py --show 1234     # one case in this process: its model, hardware, outcome

Each case comes from its seed alone (`stagec.fuzz.campaign.make_case`): the mode (fp32 or int8), the
hardware kind (default, tiny or random) and the model.  Outcomes: ok, rejected:<ErrorClass> (a
StagecError at compile; TilingError and QuantizationError are limits of the hardware and the data,
other classes gaps of the compiler), wrong, crash, fallback (the batched executor refused the
program), hang (over --timeout seconds of CPU: its worker is killed and replaced).  Prints a progress line and a
table of outcomes by mode and writes JSON: per section, counts by outcome and by mode, every case
that is not ok with its seed, mode, hardware, model and message, and a short row of every case.

A section is one kind of job (`stagec.fuzz.sections.SECTIONS`): "models" as above, "files" (a seed
picks a valid program file of `stagec.fuzz.files.BASES` and one random mutation of it; its outcomes are
ok, rejected:<ErrorClass>, crash and hang, counted by base).  --sections picks them, --cases is per
section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

# one thread per worker: workers run side by side, and threads of one process fight over the cores.  XLA's
# backend optimizations (which do not change the arithmetic) are most of compiling the simulator's groups,
# and each random model has groups of new shapes: off, a case costs ~15% less CPU
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 "
                      "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from stagec.fuzz.campaign import TOLERANCE, make_case, run_case  # noqa: E402
from stagec.fuzz.pool import run_jobs  # noqa: E402
from stagec.fuzz.sections import SECTIONS, run_job  # noqa: E402

FAILURES = ("wrong", "crash", "hang", "fallback")
CHECKPOINT = 25
WORKER_RSS_BYTES = 3 * 2**30   # a worker holding more (JAX's compiled groups of every shape met) is replaced
COMPACT = ("seed", "mode", "hw_kind", "outcome", "error", "tolerance", "cosine", "seconds")   # every case's row


def init_worker() -> None:
    import warnings

    import torch
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")   # torch's and stagec's notes on the random models, once per case


def lost_record(section: str, seed: int, status: str, value) -> dict:
    """The record of a job that did not finish: its description, and hang or a dead worker's crash."""
    record = SECTIONS[section].describe(seed)
    if status == "hang":
        return {**record, "outcome": "hang", "message": f"over the time limit: {value}"}
    return {**record, "outcome": "crash", "message": f"the worker died (exit code {value})"}


def summarize(section: str, records: list[dict]) -> dict:
    by_outcome = Counter(r["outcome"] for r in records)
    by_mode = defaultdict(Counter)
    for r in records:
        by_mode[r["mode"]][r["outcome"]] += 1
    kinds = Counter(r["outcome"].split(":")[0] for r in records)
    return {"cases": len(records), "by_outcome": dict(sorted(by_outcome.items())), "accuracy": accuracy(records),
            "causes": causes(records),
            "by_mode": {m: dict(sorted(c.items())) for m, c in sorted(by_mode.items())},
            "failures": {k: kinds.get(k, 0) for k in FAILURES},
            "unacceptable_rejections": sum(n for o, n in by_outcome.items() if o.startswith("rejected:")
                                           and not acceptable(section, o)),
            "not_ok": sorted((r for r in records if r["outcome"] != "ok"), key=lambda r: (r["outcome"], r["seed"])),
            "all": [{k: r[k] for k in COMPACT if k in r} for r in sorted(records, key=lambda r: r["seed"])]}


def acceptable(section: str, outcome: str) -> bool:
    """Whether `outcome` is not a failure: ok, or a rejection the section accepts."""
    rejected = outcome.removeprefix("rejected:")
    accepted = SECTIONS[section].acceptable_rejections
    return outcome == "ok" or (rejected != outcome and (accepted is None or rejected in accepted))


def cause(message: str) -> str:
    """A message with what varies between cases of one cause taken out: layer names, the source
    location, numbers."""
    head, sep, rest = message.partition(": ")
    message = rest if sep and " " not in head else message
    message = re.sub(r"\([^()\s]*/[^()\s]*\)", "(layer)", message.split("\n")[0].split(", at ")[0])
    return re.sub(r"\d+", "N", message)[:100]


def causes(records: list[dict]) -> dict:
    """{outcome: {cause: cases}} of the cases that are not ok, most frequent first."""
    counts = defaultdict(Counter)
    for r in records:
        if r["outcome"] != "ok" and r.get("message"):
            counts[r["outcome"]][cause(r.get("message", ""))] += 1
    return {o: dict(c.most_common()) for o, c in sorted(counts.items())}


def accuracy(records: list[dict]) -> dict:
    """Per mode, over the ok cases: the largest error against the reference (fp32: PyTorch; int8: the
    integer reference) of those held to TOLERANCE, how many were held to a wider one (models that
    amplify rounding), and the int8 cosines with PyTorch (min, 5th percentile, median)."""
    out = {}
    for mode in sorted({r["mode"] for r in records if "error" in r}):   # the sections that measure one
        ok = [r for r in records if r["mode"] == mode and r["outcome"] == "ok" and r.get("error") is not None]
        cosines = sorted(r["cosine"] for r in ok if r.get("cosine") is not None)
        out[mode] = {"max_error": max((r["error"] for r in ok if r["tolerance"] <= TOLERANCE), default=None),
                     "widened": sum(r["tolerance"] > TOLERANCE for r in ok),
                     "cosine": {"min": cosines[0], "p05": cosines[len(cosines) // 20],
                                "median": cosines[len(cosines) // 2]} if cosines else None}
    return out


def table(section: str, summary: dict) -> str:
    modes = sorted(summary["by_mode"])
    lines = [f"{section}: {summary['cases']} cases", f"{'outcome':<34}" + "".join(f"{m:>8}" for m in modes) +
             f"{'total':>8}"]
    for outcome, total in summary["by_outcome"].items():
        lines.append(f"{outcome:<34}" + "".join(f"{summary['by_mode'][m].get(outcome, 0):>8}" for m in modes) +
                     f"{total:>8}")
    for mode, a in summary["accuracy"].items():
        line = f"{mode}: " + (f"largest error of an ok case {a['max_error']:.3g}" if a["max_error"] is not None
                              else "no ok case") + f" ({a['widened']} held to a widened tolerance)"
        if c := a["cosine"]:
            line += f"; cosine with PyTorch: min {c['min']:.4f}, 5% {c['p05']:.4f}, median {c['median']:.5f}"
        lines.append(line)
    for outcome, counted in summary["causes"].items():
        lines += [f"  {n:>5}  {outcome}: {c}" for c, n in counted.items()]
    f = summary["failures"]
    lines.append("failures: " + ", ".join(f"{k} {f[k]}" for k in FAILURES) +
                 f"; unacceptable rejections: {summary['unacceptable_rejections']}")
    return "\n".join(lines)


def progress(done: int, total: int, counts: Counter, start: float) -> str:
    kinds = Counter()
    for outcome, n in counts.items():
        kinds[outcome.split(":")[0]] += n
    rate = done / max(time.monotonic() - start, 1e-9) * 60
    return (f"[{done}/{total}] " + " ".join(f"{k} {kinds.get(k, 0)}" for k in ("ok", "rejected", *FAILURES)) +
            f"  ({rate:.1f} cases/min)")


def campaign(sections: list[str], cases: int, first_seed: int, workers: int, timeout_s: float,
             save: Callable[[dict], None]) -> dict:
    """Run the cases; `save` gets the summaries every CHECKPOINT cases (a long campaign that stops
    keeps what it found) and at the end."""
    records = defaultdict(list)
    for section in sections:
        jobs = [(section, seed) for seed in range(first_seed, first_seed + cases)]
        counts, start = Counter(), time.monotonic()
        for (_, seed), status, value in run_jobs(jobs, run_job, workers, timeout_s, init=init_worker,
                                                 jobs_per_worker=SECTIONS[section].jobs_per_worker,
                                                 max_rss_bytes=WORKER_RSS_BYTES):
            record = value if status == "done" else lost_record(section, seed, status, value)
            records[section].append(record)
            counts[record["outcome"]] += 1
            done = sum(counts.values())
            print(f"\r{section} " + progress(done, len(jobs), counts, start), end="", flush=True)
            if done % CHECKPOINT == 0:
                save({s: summarize(s, records[s]) for s in records})
        print()
    result = {s: summarize(s, records[s]) for s in sections}
    save(result)
    return result


def retabulate(path: Path) -> None:
    """The table of a saved campaign, summarized again (by this script's summary) from its rows."""
    for section, saved in json.loads(path.read_text())["sections"].items():
        full = {r["seed"]: r for r in saved["not_ok"]}
        print(table(section, summarize(section, [full.get(r["seed"], r) for r in saved["all"]])))


def show(seed: int) -> None:
    init_worker()
    case = make_case(seed)
    print(case)
    outcome = run_case(case)
    print("\n".join(f"{k}: {v}" for k, v in dataclasses.asdict(outcome).items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="cases per section")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--sections", nargs="*", default=["models"], choices=sorted(SECTIONS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="CPU seconds per case before it counts as a hang (wall-clock: 5 times that)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz_campaign.json"))
    parser.add_argument("--show", type=int, metavar="SEED", help="run one model case here and print it")
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the table of a saved campaign")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # a killed campaign stops its workers too
    if args.show is not None:
        return show(args.show)
    if args.table is not None:
        return retabulate(args.table)
    start, out = time.monotonic(), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(sections: dict) -> None:
        out.write_text(json.dumps({"machine": platform.platform(), "argv": sys.argv[1:], "seconds":
                                   round(time.monotonic() - start, 1), "sections": sections}, indent=1, default=str))
    for section, summary in campaign(args.sections, args.cases, args.first_seed, args.workers, args.timeout,
                                     save).items():
        print(table(section, summary))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
