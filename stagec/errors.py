"""Every error stagec raises on purpose, in one hierarchy under `StagecError`.

A user's mistake (a model stagec cannot compile, a bad config or program file, wrong inputs)
raises one of these with a message that names what is wrong and where (the op and source line,
the config field, the byte offset, the instruction).  Anything else escaping stagec is a bug.

Each class also derives from the built-in exception it refines, so `except ValueError` code
written against earlier releases keeps working.  This module imports nothing: every stage,
`isa` included, may depend on it.

    >>> import stagec
    >>> try:
    ...     stagec.HardwareConfig(array_rows=0)
    ... except stagec.StagecError as e:
    ...     print(type(e).__name__, e)
    ConfigError HardwareConfig.array_rows = 0: expected an integer in [1, 1024]
"""

from __future__ import annotations


class StagecError(Exception):
    """Base of every error stagec raises on purpose."""


# --- the user's request: arguments, inputs, options ---
class InputError(StagecError, TypeError, ValueError):
    """An argument of a public function is wrong: inputs that do not match the program, a bad
    option value, an empty calibration set, a model spec that names nothing."""


class ConfigError(StagecError, ValueError):
    """A hardware config value is out of its allowed range or of the wrong type, or a key is unknown."""


# --- frontend ---
class ExportError(StagecError, RuntimeError):
    """torch.export could not capture the model."""


class UnsupportedOpError(StagecError, NotImplementedError):
    """An ATen op of the model has no stagec rule (or a rule that rejects its arguments)."""


# --- lowering ---
class LoweringError(StagecError, NotImplementedError):
    """A jaxpr equation or graph op the lowering cannot map; names the primitive or the layer."""


class QuantizationError(StagecError, ValueError):
    """int8 quantization cannot represent a value: no or a degenerate calibrated range, a bias or
    scale ratio beyond what the fixed-point requantization holds."""


class TilingError(StagecError, ValueError):
    """No legal tiling: even the smallest tile does not fit the on-chip memories, or the whole
    program does not fit DRAM; names the layer, the memory, the bytes needed and the capacity."""


# --- programs ---
class ProgramFormatError(StagecError, ValueError):
    """A program file is truncated, corrupt, or of an unsupported version; names the byte offset
    or the header key."""


class AssemblyError(StagecError, ValueError):
    """Assembly text that does not parse; names the line."""


class VerificationError(StagecError, ValueError):
    """A program breaks an ISA rule; names the instruction index and the field."""

    def __init__(self, message: str, index: int | None = None, field: str | None = None):
        self.index, self.field = index, field
        where = ""
        if index is not None:
            where = f"instruction {index}" + (f", field '{field}'" if field else "") + ": "
        super().__init__(where + message)


# --- simulation ---
class SimulationError(StagecError, RuntimeError):
    """A run hit a data-dependent error (a GATHER index outside its table); names the instruction."""


class TimingError(StagecError, ValueError):
    """The token pattern cannot be timed (a pop with no push, or one that waits for a later push)."""


class PlanError(StagecError, NotImplementedError):
    """A program is outside what the batched executor runs (the reference interpreter runs it)."""


class ReferenceFallbackWarning(UserWarning):
    """The batched executor refused a program (a PlanError) and the reference interpreter runs it:
    the results are right, at hundreds of times the cost.  stagec's own tests raise it as an error
    (pyproject.toml's filterwarnings): every program the compiler emits must run batched."""


class AccuracyWarning(UserWarning):
    """compile(..., accuracy_target=...) could not reach the target even with every int8 layer
    bf16: the program is the most accurate mix found."""


class PrecisionWarning(UserWarning):
    """compile(..., layer_precision=...) pinned a layer int8 that has no int8 kernel: it runs in the
    float fallback instead, and the warning names it."""


class TargetWarning(UserWarning):
    """compile(..., latency_target_s=..., power_budget_w=...) could not meet a target with what it
    tries (stagec.targets): the program is the closest found, and its report says by how much."""


def shown(value, limit: int = 60) -> str:
    """A value as an error message shows it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


__all__ = ["AccuracyWarning", "AssemblyError", "ConfigError", "ExportError", "InputError", "LoweringError",
           "PlanError", "PrecisionWarning", "ProgramFormatError", "QuantizationError", "ReferenceFallbackWarning",
           "SimulationError", "StagecError", "TargetWarning", "TilingError", "TimingError", "UnsupportedOpError",
           "VerificationError"]
