"""Named hardware presets: documented HardwareConfig YAML files shipped with the package.

Each `<name>.yaml` here is an ordinary hardware config file (what `--hw file.yaml` and
`HardwareConfig.load` read); its leading comment block is its description.

    >>> from stagec import presets
    >>> presets.load("wearable").array_rows
    8
    >>> "gemmini" in presets.names()
    True
"""

from __future__ import annotations

from pathlib import Path

from stagec.errors import ConfigError
from stagec.isa.config import HardwareConfig

_HERE = Path(__file__).parent


def names() -> tuple[str, ...]:
    """The presets, `default` first."""
    found = sorted(p.stem for p in _HERE.glob("*.yaml"))
    return tuple(sorted(found, key=lambda n: n != "default"))


def path(name: str) -> Path:
    if name not in names():
        raise ConfigError(f"no hardware preset {name!r}; the presets are {', '.join(names())}")
    return _HERE / f"{name}.yaml"


def load(name: str) -> HardwareConfig:
    """The preset called `name` (names())."""
    return HardwareConfig.load(path(name))


def description(name: str) -> str:
    """The preset's leading comment block, as one paragraph."""
    lines = path(name).read_text(encoding="utf-8").splitlines()
    text = []
    for line in lines:
        if not line.startswith("#"):
            break
        text.append(line.lstrip("# ").rstrip())
    return " ".join(text)


def resolve(spec: str, what: str = "--hw") -> HardwareConfig:
    """`--hw`'s value: a preset name, else a YAML or JSON config file; neither is a ConfigError that
    names it and lists the presets."""
    if spec in names():
        return load(spec)
    if Path(spec).is_file():
        return HardwareConfig.load(spec)
    raise ConfigError(f"{what} {spec!r} is neither a preset ({', '.join(names())}) nor a readable config file")
