"""Shrink a failing case to a smaller model that fails the same way (greedy delta debugging).

Each step tries, at every position: dropping the layer, dropping every layer after it, and putting a
composite's inside (a residual's body, one concat branch) in its place; a candidate whose layers no
longer build on their new input shapes is skipped.  The hardware, mode and input shape stay.

    >>> overflow = lambda o: o.outcome == "rejected:TilingError" and "overflow" in o.message
    >>> small = minimize(make_case(1029), overflow)  # doctest: +SKIP
    >>> print(small.spec)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from .campaign import Case, Outcome, run_case
from .models import model_spec
from .spec import Layer, is_chain, is_chains


def minimize(case: Case, fails: Callable[[Outcome], bool], max_runs: int = 200) -> Case:
    """The smallest case found (by greedy steps) whose outcome still satisfies `fails`."""
    runs = 0
    improved = True
    while improved and runs < max_runs:
        improved = False
        for layers in _candidates(case.spec.layers):
            smaller = _with_layers(case, layers)
            if smaller is None:
                continue
            runs += 1
            if fails(run_case(smaller)):
                case, improved = smaller, True
                break
            if runs >= max_runs:
                break
    return case


def _candidates(layers: tuple[Layer, ...], keep_one: bool = True) -> Iterator[tuple[Layer, ...]]:
    """Smaller chains: shorter, a composite replaced by a chain inside it, or a composite with a
    smaller chain inside it."""
    for i, layer in enumerate(layers):
        if i + 1 < len(layers):
            yield layers[: i + 1]
        if len(layers) > 1 or not keep_one:
            yield layers[:i] + layers[i + 1:]
        for inside in layer.insides():
            yield layers[:i] + inside + layers[i + 1:]
        for smaller in _smaller_insides(layer):
            yield layers[:i] + (smaller,) + layers[i + 1:]


def _smaller_insides(layer: Layer) -> Iterator[Layer]:
    """The layer with one of its inside chains smaller (a branch may become the identity)."""
    for k, (name, value) in enumerate(layer.params):
        chains = (value,) if is_chain(value) else value if is_chains(value) else ()
        for j, chain in enumerate(chains):
            for smaller in _candidates(chain, keep_one=False):
                new = smaller if chains is not value else value[:j] + (smaller,) + value[j + 1:]
                yield dataclasses.replace(layer, params=layer.params[:k] + ((name, new),) + layer.params[k + 1:])


def _with_layers(case: Case, layers: tuple[Layer, ...]) -> Case | None:
    spec = model_spec(case.spec.seed, case.spec.input_shape, layers)
    return None if spec is None else dataclasses.replace(case, spec=spec)
