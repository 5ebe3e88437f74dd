"""`stagec hw list` and `stagec hw show NAME`: the hardware presets (stagec.presets)."""

from __future__ import annotations


def describe(hw) -> list[str]:
    """A config's headline numbers: area (sim.energy's table) and peak throughput."""
    from stagec.report import PRECISION_ITEMSIZE
    from stagec.sim.costs import array_macs_per_cycle
    from stagec.sim.energy import area_mm2
    area = area_mm2(hw)
    peaks = ", ".join(f"{dtype} {(peak := array_macs_per_cycle(hw, size))} MACs/cycle = "
                      f"{2 * peak * hw.clock_hz / 1e9:.1f} GOPS"   # widest first
                      for dtype, size in reversed(PRECISION_ITEMSIZE.items()) if dtype in hw.dtypes)
    return [f"area: {sum(area.values()):.3f} mm^2 (" + ", ".join(f"{k} {v:.3f}" for k, v in area.items()) + ")",
            f"peak: {peaks} at {hw.clock_hz / 1e6:g} MHz (a MAC is 2 ops); "
            f"DRAM {hw.dma_bandwidth_bytes_per_cycle * hw.clock_hz / 1e9:.1f} GB/s"]


def _list(args) -> int:
    from stagec.sim.costs import array_macs_per_cycle
    from stagec.sim.energy import area_mm2

    from . import presets
    for name in presets.names():
        hw = presets.load(name)
        shape = f"{hw.array_rows}x{hw.array_cols}"
        print(f"{name:<10} {shape:<6} {'/'.join(hw.dtypes):<14} "
              f"{hw.scratchpad_bytes // 1024:>5} KiB  {sum(area_mm2(hw).values()):6.3f} mm^2  "
              f"{2 * hw.peak_macs_per_cycle * hw.clock_hz / 1e9:6.1f} GOPS fp32, "
              f"{2 * array_macs_per_cycle(hw, 1) * hw.clock_hz / 1e9:.1f} int8")
    return 0


def _show(args) -> int:
    from stagec.isa.config import FIELD_DOCS

    from . import presets
    from .cli_args import hardware
    hw = hardware(args.name, "hw show")
    if args.name in presets.names():
        print(f"{args.name}: {presets.description(args.name)}\n")
    width = max(map(len, FIELD_DOCS))
    for name, value in hw.to_dict().items():
        print(f"{name:<{width}}  {value!s:<14} {FIELD_DOCS[name]}")
    print("\n" + "\n".join(describe(hw)))
    return 0


def add_commands(command) -> None:
    hw = command("hw", None, "the hardware presets: list them, show one's fields, area and peak throughput",
                 "stagec hw list\n  stagec hw show wearable")
    sub = hw.add_subparsers(dest="hw_command", required=True)
    sub.add_parser("list", help="the presets, one a line").set_defaults(run=_list)
    show = sub.add_parser("show", help="a preset's (or a config file's) fields, area and peak throughput")
    show.add_argument("name", metavar="PRESET|FILE")
    show.set_defaults(run=_show)
