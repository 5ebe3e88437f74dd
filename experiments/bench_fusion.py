"""Cascades (cross-layer fusion) against layer by layer, side by side in one run: per model, config
and precision, the cascades the mapper chose (and how many keep a line buffer, lower.schedule.halo),
DRAM bytes, cycles, energy, EDP and cycles over the model-level limit (stagec.report.model_limit),
fused and with compile(fuse_layers=False).

    python experiments/bench_fusion.py [--full] [--int8] [models...]

Models: a pointwise chain (three 1x1 convs, 56x56), reduced zoo BERT, Whisper-tiny's encoder,
MobileNetV2, EfficientNet-B0 and ResNet-50, and with `--full` the full-size ones (Whisper: 30 s of
audio).  `--configs` picks configs by name.  Configs: the default and a wearable one
(8x8 array, 128 KiB scratchpad, 32 KiB accumulator, 4 B/cycle DRAM).  Reports come from the timing
simulator (stagec.report.make_report); nothing is executed.  Writes experiments/results/bench_fusion.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import stagec
from stagec import zoo
from stagec.isa import HardwareConfig
from stagec.report import make_report

CONFIGS = {
    "default": HardwareConfig(),
    "wearable": HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=128 * 1024, accumulator_bytes=32 * 1024,
                               dma_bandwidth_bytes_per_cycle=4.0),
}


def pointwise_chain(reduced: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(24, 144, 1), torch.nn.ReLU6(), torch.nn.Conv2d(144, 32, 1),
                                torch.nn.ReLU(), torch.nn.Conv2d(32, 96, 1)).eval()
    return model, (torch.randn(1, 24, 56, 56),), {}


MODELS = {
    "pointwise": lambda full: pointwise_chain(),
    "bert": lambda full: zoo.build("bert_base", reduced=not full),
    "whisper": lambda full: zoo.build("whisper_tiny_encoder", reduced=not full),
    "mobilenet_v2": lambda full: zoo.build("mobilenet_v2", reduced=not full),
    "efficientnet_b0": lambda full: zoo.build("efficientnet_b0", reduced=not full),
    "resnet50": lambda full: zoo.build("resnet50", reduced=not full),
}


def measure(model, args, kwargs, hw, quantize, fuse_layers) -> dict:
    t = time.perf_counter()
    program = stagec.compile(model, args, kwargs=kwargs, hw=hw, quantize=quantize, fuse_layers=fuse_layers)
    seconds = time.perf_counter() - t
    r = make_report(program)
    energy = sum(r.energy_pj.values())
    return {"dram_bytes": r.actions.dram_read_bytes + r.actions.dram_write_bytes, "cycles": r.cycles,
            "energy_pj": energy, "edp": energy * r.cycles, "over_limit": r.cycles_over_model_limit,
            "cascades": len(r.cascades), "fused_layers": sum(len(c["layers"]) for c in r.cascades),
            "line_buffers": sum(c.get("halo") == "line buffer" for c in r.cascades),
            "compile_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--full", action="store_true", help="full-size zoo models")
    parser.add_argument("--int8", action="store_true", help="int8 as well as fp32")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    opts = parser.parse_args()
    rows = []
    head = (f"{'model':<14} {'config':<9} {'prec':<5} {'casc':>4} {'line':>4} {'DRAM MiB':>9} {'x':>5} "
            f"{'Mcycles':>8} {'x':>5} {'energy uJ':>10} {'x':>5} {'EDP gain':>8} {'/limit':>6} {'alone':>6} "
            f"{'compile s':>9} {'alone':>6}")
    print(head)
    print("-" * len(head))
    for name in opts.models:
        model, args, kwargs = MODELS[name](opts.full)
        for config in opts.configs:
            hw = CONFIGS[config]
            for quantize in (None, "int8") if opts.int8 else (None,):
                fused = measure(model, args, kwargs, hw, quantize, True)
                alone = measure(model, args, kwargs, hw, quantize, False)
                rows.append({"model": name, "full": opts.full, "config": config, "quantize": quantize,
                             "fused": fused, "layer_by_layer": alone})
                print(f"{name:<14} {config:<9} {quantize or 'fp32':<5} {fused['cascades']:>4} "
                      f"{fused['line_buffers']:>4} "
                      f"{fused['dram_bytes'] / 2**20:>9.2f} {fused['dram_bytes'] / alone['dram_bytes']:>5.2f} "
                      f"{fused['cycles'] / 1e6:>8.3f} {fused['cycles'] / alone['cycles']:>5.2f} "
                      f"{fused['energy_pj'] / 1e6:>10.1f} {fused['energy_pj'] / alone['energy_pj']:>5.2f} "
                      f"{alone['edp'] / fused['edp']:>8.2f} {fused['over_limit']:>6.2f} {alone['over_limit']:>6.2f} "
                      f"{fused['compile_s']:>9.1f} {alone['compile_s']:>6.1f}",
                      flush=True)
    out = Path(__file__).parent / "results" / "bench_fusion.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
