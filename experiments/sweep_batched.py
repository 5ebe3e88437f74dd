"""A wider sweep of tests/test_batched_layers.py's property: random conv/linear layers on random
hardware configs, fp32 and int8, each compiled, planned for the batched executor and compared with
its reference.  Unlike the test it goes on past a failure and reports every one, grouped by message.

    python experiments/sweep_batched.py [--examples 300] [--seed 0]

Writes experiments/results/sweep_batched.json: the number of cases drawn and rejected (nothing fits
the memories, or the program is too large for the test) and, per distinct failure
(numbers in the message masked), how often it occurred and its first case.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import UnsatisfiedAssumption

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the test's strategy and check
from test_batched_layers import check, layer_cases  # noqa: E402


def describe(case) -> str:
    hw = case.hw
    return (f"{case.layer} on {tuple(case.shape)}, {'int8' if case.int8 else 'fp32'}, seed {case.seed}; "
            f"array {hw.array_rows}x{hw.array_cols} {hw.dataflow}, scratchpad {hw.scratchpad_bytes}, "
            f"accumulator {hw.accumulator_bytes}, {hw.vector_lanes} lanes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    failures: Counter = Counter()
    first: dict[str, str] = {}
    ran = rejected = 0

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(layer_cases())
    def sweep(case):
        nonlocal ran, rejected
        ran += 1
        try:
            check(case)
        except UnsatisfiedAssumption:   # nothing fits, or too large a program for the test
            rejected += 1
            raise
        except Exception as e:   # noqa: BLE001 -- every failure is recorded, the sweep goes on
            key = f"{type(e).__name__}: {re.sub(r'[0-9]+', '#', str(e).splitlines()[0] if str(e) else '')[:200]}"
            failures[key] += 1
            first.setdefault(key, describe(case))
            print(f"FAIL {key}\n  {describe(case)}", flush=True)

    t = time.perf_counter()
    sweep()
    result = {"examples": ran, "rejected": rejected, "seconds": round(time.perf_counter() - t, 1),
              "failures": [{"message": k, "count": n, "first": first[k]} for k, n in failures.most_common()]}
    print(json.dumps(result, indent=1))
    out = Path(__file__).parent / "results" / "sweep_batched.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
