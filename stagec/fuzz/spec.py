"""A model of the fuzz grammar (stagec.fuzz.models) as data: a chain of layers over one tensor, each a
rule's name and parameters, frozen and printable; and the shape conventions the rules share.
"""

from __future__ import annotations

from dataclasses import dataclass

Shape = tuple[int, ...]


def feature_dim(shape: Shape) -> int:
    """The dim of a shape's features: the channels of an image (N, C, H, W), the last dim of a
    sequence (N, T, D) or a vector (N, F)."""
    return 1 if len(shape) == 4 else len(shape) - 1


@dataclass(frozen=True)
class Layer:
    """One layer: a rule's name and its parameters; composite layers hold layers in their parameters."""

    kind: str
    params: tuple[tuple[str, object], ...] = ()

    def insides(self) -> tuple[tuple[Layer, ...], ...]:
        """The chains inside this layer: a residual's body, each of a concat's branches."""
        return tuple(chain for _, value in self.params
                     for chain in ((value,) if is_chain(value) else value if is_chains(value) else ()))

    def nested(self) -> tuple[Layer, ...]:
        """The layers inside this one, at every depth."""
        return tuple(x for chain in self.insides() for layer in chain for x in (layer, *layer.nested()))

    def __str__(self) -> str:
        parts = []
        for name, value in self.params:
            if is_chain(value) or value == ():
                parts.append(f"{name}=[{'; '.join(map(str, value)) or 'identity'}]")
            elif is_chains(value):
                parts.append(f"{name}=[{' | '.join('; '.join(map(str, c)) or 'identity' for c in value)}]")
            else:
                parts.append(f"{name}={value!r}")
        return f"{self.kind}({', '.join(parts)})"


def is_chain(value) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(v, Layer) for v in value)


def is_chains(value) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(v, tuple) and all(
        isinstance(x, Layer) for x in v) for v in value) and not is_chain(value)


@dataclass(frozen=True)
class ModelSpec:
    """A model of the grammar: its input shape, layers and each layer's output shape."""

    seed: int
    input_shape: Shape
    layers: tuple[Layer, ...]
    shapes: tuple[Shape, ...]

    def kinds(self) -> frozenset[str]:
        """The rules the model uses, composites' insides included."""
        return frozenset(x.kind for layer in self.layers for x in (layer, *layer.nested()))

    def __str__(self) -> str:
        lines = [f"input {self.input_shape}"]
        lines += [f"  {layer}  -> {shape}" for layer, shape in zip(self.layers, self.shapes, strict=True)]
        return "\n".join(lines)
