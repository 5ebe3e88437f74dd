"""The cascade mapper's time and choices (issue 19): map_cascade (lower.schedule.cascade_map) over every
segment of every chain of a scheduled model, timed (CPU seconds, best of `--repeat`: the machine may
be shared), and what it picked per segment and which cascades the schedule took, written to JSON so
that two versions can be compared exactly.

    python experiments/bench_map_cascade.py [--full] [--repeat 3] [--out FILE] [models...]

Models: bench_fusion's (default: mobilenet_v2 and efficientnet_b0), fp32, on the default config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from bench_fusion import CONFIGS, MODELS

from stagec.lower.schedule.cascade import MAX_SPAN
from stagec.lower.schedule.cascade_map import chains, map_cascade
from stagec.pipeline import PIPELINE, Compilation, Request, position, run


def picked(mapped) -> dict | None:
    """A Mapped as plain data (None where nothing fits)."""
    if mapped is None:
        return None
    return {"tile": list(mapped.tile), "mappings": [str(dataclasses.asdict(m)) for m in mapped.mappings],
            "chunk": mapped.chunk, "halo": mapped.halo, "cycles": mapped.cycles, "energy": mapped.energy,
            "value": mapped.value}


def measure(name: str, full: bool, repeat: int) -> dict:
    model, args, kwargs = MODELS[name](full)
    hw = CONFIGS["default"]
    c = run(PIPELINE[:position("schedule") + 1], Compilation(Request(model, args, kwargs=kwargs, hw=hw)))
    tilings = dict(c.schedule.tilings)
    segments = []
    for found in chains(c.graph, c.layout, tilings, frozenset()):
        nests = [tilings[node.name].nests[0] for node in found]
        segments += [nests[i:j] for j in range(2, len(nests) + 1) for i in range(max(0, j - MAX_SPAN), j - 1)]
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        mapped = [map_cascade(s, hw, c.request.objective) for s in segments]
        best = min(best, time.process_time() - t)
    return {"segments": len(segments), "map_s": best, "picked": [picked(m) for m in mapped],
            "cascades": [str(k) for k in c.schedule.cascades]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["mobilenet_v2", "efficientnet_b0"])
    parser.add_argument("--full", action="store_true", help="full-size zoo models")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_map_cascade.json"))
    opts = parser.parse_args()
    out = {}
    for name in opts.models:
        out[name] = measure(name, opts.full, opts.repeat)
        print(f"{name:<16} {out[name]['segments']:>4} segments  map_cascade {out[name]['map_s']:.3f} CPU s  "
              f"{len(out[name]['cascades'])} cascades", flush=True)
    Path(opts.out).parent.mkdir(exist_ok=True)
    Path(opts.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
