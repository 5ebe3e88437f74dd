"""stagec: a staged compiler, hosted in JAX, for on-device ML accelerators.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
    >>> x = torch.randn(1, 3, 16, 16)
    >>> program = stagec.compile(model, (x,))          # torch.export -> jaxpr -> instructions
    >>> y, report = stagec.simulate(program, x)        # run on the simulated accelerator

The names below the errors are imported from their modules on first use (stagec.lazy): `import
stagec` and `stagec --help` load neither torch nor JAX.
"""

from stagec.errors import (
    AccuracyWarning,
    AssemblyError,
    ConfigError,
    ExportError,
    InputError,
    LoweringError,
    PlanError,
    PrecisionWarning,
    ProgramFormatError,
    QuantizationError,
    ReferenceFallbackWarning,
    SimulationError,
    StagecError,
    TargetWarning,
    TilingError,
    TimingError,
    UnsupportedOpError,
    VerificationError,
)
from stagec.lazy import lazy_attributes

_HOMES = {
    "HardwareConfig": "stagec.isa", "Program": "stagec.isa",
    "compile": "stagec.compiler", "simulate": "stagec.api", "load": "stagec.program_file",
    "Report": "stagec.report",
    "TuneSettings": "stagec.tuning", "Tuning": "stagec.tuning", "tune": "stagec.tuning",
    # NOTE: not in a module stagec.codesign: importing it would set the package's `codesign` to the module
    "Codesign": "stagec.codesigning", "codesign": "stagec.codesigning",
    "sweep": "stagec.sweeps", "load_results": "stagec.sweeps",
    "Sensitivities": "stagec.sensitivity", "sensitivities": "stagec.sensitivity",
}
__getattr__, __dir__ = lazy_attributes(__name__, _HOMES)

__all__ = ["AccuracyWarning", "AssemblyError", "Codesign", "ConfigError", "ExportError", "HardwareConfig", "InputError",
           "LoweringError", "PlanError", "PrecisionWarning", "Program", "ProgramFormatError", "QuantizationError",
           "ReferenceFallbackWarning", "Report", "Sensitivities", "SimulationError", "StagecError", "TargetWarning",
           "TilingError", "TimingError", "TuneSettings", "Tuning", "UnsupportedOpError", "VerificationError",
           "codesign", "compile", "load", "load_results", "sensitivities", "simulate", "sweep", "tune"]
__version__ = "0.1.0"
