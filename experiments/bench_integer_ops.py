"""I-BERT's integer-only softmax, layer norm and GELU (compile's integer_ops=) against the default
bf16 float islands, on the zoo's transformers, in one run: DRAM bytes, cycles, energy and cosine
against fp32 PyTorch of int8 with bf16 islands, with integer softmax, integer layer norm (per-tensor
and per-channel power-of-two ranges: activation_ranges="channel"), both, all three, and fp32.

    python experiments/bench_integer_ops.py [models...] [--full bert_base ...] [--calibration 4]
                                            [--out FILE]

Models run in their reduced configs unless named in --full.  int8 calibrates on --calibration
batches of fresh random inputs and is measured on the zoo's own example input.  Writes
experiments/results/bench_integer_ops.json.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from stagec import zoo
from stagec.precision import calibration_batches, run_precision

MODELS = ("bert_base", "vit_b16", "whisper_tiny_encoder")
VARIANTS = {"bf16 islands": {}, "int softmax": {"integer_ops": "softmax"},
            "int layernorm": {"integer_ops": "layer_norm"},
            "int ln, ptf": {"integer_ops": "layer_norm", "activation_ranges": "channel"},
            "int sm+ln": {"integer_ops": ("softmax", "layer_norm")},
            "int all, ptf": {"integer_ops": "all", "activation_ranges": "channel"}}


def bench(name: str, full: bool, n_calibration: int) -> dict:
    model, args, kwargs = zoo.build(name, reduced=not full)
    with torch.no_grad():
        ref = model(*args, **kwargs)
    calibration = calibration_batches(args, kwargs, n_calibration)
    fp32 = run_precision(model, args, kwargs, "fp32", reference=ref)
    rows = {"fp32": fp32.to_dict()}
    for label, options in VARIANTS.items():
        rows[label] = run_precision(model, args, kwargs, "int8", calibration=calibration, reference=ref,
                                    **options).to_dict()
    return {"model": name, "size": "full" if full else "reduced", "runs": rows}


def table(results: list[dict]) -> str:
    lines = [f"{'model':<22} {'variant':<14} {'cosine':>8} {'DRAM KiB':>9} {'DRAM/bf16isl':>12} "
             f"{'cycles/bf16isl':>14} {'energy/bf16isl':>14}"]
    for r in results:
        base = r["runs"]["bf16 islands"]
        for label, run in r["runs"].items():
            lines.append(f"{r['model'] + ' (' + r['size'] + ')':<22} {label:<14} {run['cosine']:>8.5f} "
                         f"{run['dram_bytes'] / 1024:>9.1f} {run['dram_bytes'] / base['dram_bytes']:>12.3f} "
                         f"{run['cycles'] / base['cycles']:>14.3f} {run['energy_uj'] / base['energy_uj']:>14.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--full", nargs="*", default=[])
    parser.add_argument("--calibration", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_integer_ops.json"))
    a = parser.parse_args()
    results = [bench(m, m in a.full, a.calibration) for m in a.models]
    print(table(results))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"machine": platform.machine(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
