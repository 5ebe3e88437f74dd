"""One fuzz case from a seed: a random model on random hardware, fp32 or int8, against its references.

A case's outcome is one of
- "ok": the simulated output matches (fp32: PyTorch eager within TOLERANCE of max |ref|, more for
  a model that amplifies rounding; int8: `stagec.int8_reference`, bit for bit on integer work, and
  not absurdly far from PyTorch);
- "rejected:<ErrorClass>": compiling raised a StagecError (ACCEPTABLE_REJECTIONS are limits of the
  hardware or the data; any other class, an UnsupportedOpError say, is a gap of the grammar's ops);
- "wrong": the output does not match;
- "crash": an exception that is not a StagecError, or any error once the program compiled;
- "fallback": correct, but the batched executor refused the program (the reference interpreter ran it);
- "hang": over the time limit (decided by the pool that runs the case, `stagec.fuzz.pool`).

    >>> case = make_case(3, mode="fp32", hw_kind="default")
    >>> print(case)  # doctest: +SKIP
    >>> run_case(case).outcome  # doctest: +SKIP
    'ok'
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import traceback
import warnings

import numpy as np
import torch

import stagec
from stagec import int8_reference
from stagec.errors import QuantizationError, StagecError, TilingError
from stagec.lower.graph.quantize import quantize_weights
from stagec.pipeline import build_graph

from .hardware import HW_KINDS, describe, random_hardware
from .models import SCALED, build_model, generate_model
from .spec import ModelSpec

MODES = ("fp32", "int8")
# of max |ref|: what fp32 chains of differently ordered sums keep to.  int8 is held to it against the
# integer reference: integer work matches bit for bit there, and an int8 value off by one step moves
# the output by ~1/256 of max |ref| or more; the fp32 islands (softmax, norms, GELU) sum in another
# order and take exp from another library, so they differ as fp32 chains do
TOLERANCE = 1e-4
# a model whose output moves by e (of max |ref|) when each layer's output gets one fp32 rounding of noise
# (FP32_STEP) is held to ROUNDING_GAIN * e where that is more: stagec's roundings are not PyTorch's
FP32_STEP = 2.0**-23
ROUNDING_GAIN = 100.0
INT8_STEP = 1 / 127
# the fp32 islands before a QUANTIZE (softmax, norms, GELU) round differently in the simulator and the
# integer reference, by a few ulps: an int8 value whose float lies that near a rounding boundary may round
# either way (case 100782: 116.49999 vs 116.50002 steps), so at each output element, what the reference's own
# output moves there when every quantized float moves TIE_NUDGE is tolerated too (nothing where none lies so near)
TIE_NUDGE = 8 * 2.0**-23
# int8 against PyTorch: below COSINE_FLOOR, a bug rather than quantization error -- where the model keeps
# a cosine of NOISE_FLOOR or more with int8 weights and every layer's output rounded to, and noised by
# half, an int8 step of its calibrated range (a layer norm over two values, say, turns the smallest noise
# into a sign: no quantization could keep it; nor can int8 keep an input whose values are far below the
# ranges the calibration batches saw)
COSINE_FLOOR = 0.5
NOISE_FLOOR = 0.9
# ... and where that noise moves the output by less than NOISE_CEILING of its own max |value|: an output the
# noise moves by more (the mean of a layer norm's outputs, zero but for rounding: case 115076, a scalar 3e-9
# that the noise moves by 2.5e-4) has no answer int8 could keep, and the sign a scalar's cosine sees is kept
# by chance
NOISE_CEILING = 1.0
CALIBRATION_BATCHES = 3
ACCEPTABLE_REJECTIONS = frozenset({TilingError.__name__, QuantizationError.__name__})


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    mode: str
    hw_kind: str
    hw: stagec.HardwareConfig
    spec: ModelSpec

    def __str__(self) -> str:
        return f"case {self.seed}: {self.mode} on {self.hw_kind} hardware {describe(self.hw)}\n{self.spec}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: str                   # "ok", "rejected:<ErrorClass>", "wrong", "crash", "fallback" or "hang"
    message: str = ""
    error: float | None = None     # max |out - ref| / max |ref| (int8: ref is the integer reference; where
    #                                that is over the tolerance, less what rounding ties explain)
    tolerance: float | None = None  # what error passes (TOLERANCE, more for an ill-conditioned model)
    cosine: float | None = None    # int8: against PyTorch eager
    noise_cosine: float | None = None   # int8: PyTorch against itself with int8-sized noise at every layer
    seconds: float | None = None

    @property
    def kind(self) -> str:
        return self.outcome.split(":")[0]

    @property
    def acceptable(self) -> bool:
        """ok, or a rejection that is the hardware's or the data's limit."""
        return self.outcome == "ok" or self.outcome.removeprefix("rejected:") in ACCEPTABLE_REJECTIONS


def make_case(seed: int, mode: str | None = None, hw_kind: str | None = None) -> Case:
    """The case of `seed`; mode and hardware kind come from the seed unless given."""
    rng = random.Random(f"case {seed}")   # apart from the model's own stream
    mode = mode or rng.choice(MODES)
    hw_kind = hw_kind or rng.choices(HW_KINDS, (1, 1, 2))[0]
    return Case(seed, mode, hw_kind, random_hardware(rng, hw_kind), generate_model(seed))


def run_case(case: Case) -> Outcome:
    start = time.perf_counter()
    outcome = _run(case)
    return dataclasses.replace(outcome, seconds=round(time.perf_counter() - start, 3))


def _run(case: Case) -> Outcome:
    model, (x,) = build_model(case.spec)
    calibration = _calibration(case.spec, x)
    # fp32 islands: the tolerances below are fp32 chains' (bf16 islands: tests/test_mixed_precision.py)
    options = dict(quantize="int8", calibration=calibration, fallback="fp32") if case.mode == "int8" else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            program = stagec.compile(model, (x,), hw=case.hw, **options)
        except StagecError as e:
            return Outcome(f"rejected:{type(e).__name__}", str(e))
        except Exception as e:   # noqa: BLE001 -- anything else escaping stagec is a bug to report
            return Outcome("crash", describe_exception("compile", e))
        try:
            y, _ = stagec.simulate(program, x)
        except Exception as e:   # noqa: BLE001 -- a compiled program must run
            return Outcome("crash", describe_exception("simulate", e))
    fallback = [str(w.message) for w in caught if "reference interpreter" in str(w.message)]
    with torch.no_grad():
        expected = model(x).numpy()
    try:
        verdict = CHECKS[case.mode](np.asarray(y), expected, model, x, calibration)
    except Exception as e:   # noqa: BLE001 -- the int8 reference raises on what the hardware would wrap
        return Outcome("crash", describe_exception("reference", e))
    if verdict.outcome == "ok" and fallback:
        return dataclasses.replace(verdict, outcome="fallback", message=fallback[0])
    return verdict


def _calibration(spec: ModelSpec, x: torch.Tensor) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(spec.seed + 1)
    return [(x,)] + [(torch.randn(x.shape, generator=g),) for _ in range(CALIBRATION_BATCHES - 1)]


def describe_exception(stage: str, e: Exception) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"{stage}: {type(e).__name__}: {e} [{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno} in {frame.name}]"


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| (inf where shapes differ or out is not finite)."""
    if out.shape != ref.shape:
        return float("inf")
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    err = np.abs(out - ref).max(initial=0.0) / max(np.abs(ref).max(initial=0.0), 1e-30)
    return float(err) if np.isfinite(out).all() == np.isfinite(ref).all() else float("inf")


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norms) if norms else float(np.array_equal(a, b))


def _check_fp32(y, expected, model, x, calibration) -> Outcome:
    err, tolerance = rel_err(y, expected), _tolerance(model, x, expected)
    if err <= tolerance:
        return Outcome("ok", error=err, tolerance=tolerance)
    return Outcome("wrong", f"fp32 output differs from PyTorch: max error {err:.3g} of max |ref| (tolerance "
                            f"{tolerance:.3g}; shapes {y.shape} vs {expected.shape})", err, tolerance)


def _check_int8(y, expected, model, x, calibration) -> Outcome:
    _, graph = build_graph(model, (x,), quantize="int8", calibration=calibration, fallback="fp32")
    (ref,) = int8_reference.run(graph, [x.numpy()])
    cos = cosine(y, expected) if y.shape == expected.shape else float("nan")
    err, tolerance = rel_err(y, ref), _tolerance(model, x, expected)
    if tolerance < err < float("inf"):
        err = _beyond_ties(y, ref, graph, x)
    if err > tolerance:
        unequal = int((y != ref).sum()) if y.shape == ref.shape else -1
        return Outcome("wrong", f"int8 output differs from the integer reference in {unequal} of {ref.size} "
                                f"elements (max error {err:.3g} of max |ref|, tolerance {tolerance:.3g})",
                       err, tolerance, cos)
    noised = with_noise(model, x, INT8_STEP, calibration, (False, True))
    noise_cos = min(cosine(out, expected) for out in noised)
    kept = noise_cos >= NOISE_FLOOR and max(rel_err(out, expected) for out in noised) < NOISE_CEILING
    if not cos >= COSINE_FLOOR and kept:
        return Outcome("wrong", f"int8 output matches the integer reference but its cosine with PyTorch is "
                                f"{cos:.3f} (with int8-sized noise, PyTorch keeps {noise_cos:.3f})",
                       err, tolerance, cos, noise_cos)
    return Outcome("ok", error=err, tolerance=tolerance, cosine=cos, noise_cosine=noise_cos)


def _beyond_ties(y, ref, graph, x) -> float:
    """max |y - ref| / max |ref|, less at each element what the reference itself moves there when every
    float it quantizes moves TIE_NUDGE away from zero and toward it (the int8 values that a few fp32
    roundings tip over a rounding boundary, and all that depends on them)."""
    ref = ref.astype(np.float64)
    spread = sum(np.abs(int8_reference.run(graph, [x.numpy()], nudge=nudge)[0] - ref)
                 for nudge in (TIE_NUDGE, -TIE_NUDGE))
    excess = np.maximum(np.abs(y - ref) - spread, 0.0)
    return float(excess.max(initial=0.0) / max(np.abs(ref).max(initial=0.0), 1e-30))


def _tolerance(model, x, expected) -> float:
    """TOLERANCE, or more where the model turns one fp32 rounding at every layer into more than that
    (a mean of a layer-normed tensor: zero plus noise, whose every digit is rounding)."""
    return max(TOLERANCE, ROUNDING_GAIN * rel_err(with_noise(model, x, FP32_STEP)[0], expected))


def with_noise(model: torch.nn.Module, x: torch.Tensor, step: float, calibration=None,
               roundings=(False,)) -> list[np.ndarray]:
    """The model's output with uniform noise of +-step/2 of each layer's range added to that layer's
    output: how much of its answer the model keeps under rounding of that size.  Without `calibration`,
    fp32 rounding: at each leaf layer, of its own max |output| on x.  With `calibration` (batches of
    inputs), int8 rounding: each tensor in steps of the range those batches gave it, however far below it
    x's own values lie, and at every layer, composites too (int8 quantizes a residual's sum or a gate's
    product where a matmul reads it; not a Sequential's output, its last layer's), with weights in int8
    steps per output channel (case 201719: a gate's linear whose output is a near-cancelling sum of two
    terms loses it all to its weights' rounding).  One output per entry of `roundings`: noised (False), or
    each layer's output rounded to the nearest step (True: int8's error is not random, a mean over many
    elements does not average it out); the calibrated ranges and int8 weights serve them all."""
    if calibration:
        layers = [m for m in model.modules() if not isinstance(m, torch.nn.Sequential)]
        ranges = _output_ranges(model, layers, calibration)
    else:
        layers, ranges = [m for m in model.modules() if not any(m.children())], None
    weights = _int8_weights(model) if calibration else contextlib.nullcontext()
    with weights, torch.no_grad():
        return [_perturbed(model, x, layers, ranges, step, rounding) for rounding in roundings]


def _perturbed(model, x, layers, ranges, step: float, rounding: bool) -> np.ndarray:
    """The model's output with each of `layers`' outputs noised or rounded (see with_noise)."""
    g = torch.Generator().manual_seed(0)

    def noise(module, args, y):
        size = step * (ranges[module] if ranges else y.abs().max())
        if rounding:
            return torch.round(y / size) * size if size > 0 else y
        return y + (torch.rand(y.shape, generator=g) - 0.5) * size
    with _hooked(layers, noise):
        return model(x).numpy()


@contextlib.contextmanager
def _int8_weights(model: torch.nn.Module):
    """The model's conv and linear weights rounded as `lower.graph.quantize` rounds them, restored after."""
    saved = [(m.weight, m.weight.detach().clone()) for m in model.modules() if isinstance(m, SCALED)]
    for weight, w in saved:
        q, scale = quantize_weights(w.numpy(), axis=0)
        weight.data = torch.from_numpy((q * scale.reshape((-1,) + (1,) * (w.dim() - 1))).astype(np.float32))
    try:
        yield
    finally:
        for weight, w in saved:
            weight.data = w


def _output_ranges(model: torch.nn.Module, layers, batches) -> dict:
    """{layer: max |output| over the batches}."""
    ranges = dict.fromkeys(layers, 0.0)

    def record(module, args, y):
        ranges[module] = max(ranges[module], float(y.abs().max()))
    with _hooked(layers, record), torch.no_grad():
        for batch in batches:
            model(*batch)
    return ranges


@contextlib.contextmanager
def _hooked(layers, hook):
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


CHECKS = {"fp32": _check_fp32, "int8": _check_int8}


# --- campaign jobs: (section, seed) -> a JSON-ready record ----------------------------------------

def _description(case: Case) -> dict:
    return {"seed": case.seed, "mode": case.mode, "hw_kind": case.hw_kind, "hw": describe(case.hw),
            "spec": str(case.spec), "kinds": sorted(case.spec.kinds())}


def model_description(seed: int) -> dict:
    return _description(make_case(seed))


def model_record(seed: int) -> dict:
    case = make_case(seed)
    return {**_description(case), **dataclasses.asdict(run_case(case))}
