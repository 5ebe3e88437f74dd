"""stagec: a staged compiler, hosted in JAX, for on-device ML accelerators.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
    >>> x = torch.randn(1, 3, 16, 16)
    >>> program = stagec.compile(model, (x,))          # torch.export -> jaxpr -> instructions
    >>> y, report = stagec.simulate(program, x)        # run on the simulated accelerator
"""

from stagec.errors import (
    AssemblyError,
    ConfigError,
    ExportError,
    InputError,
    LoweringError,
    PlanError,
    ProgramFormatError,
    QuantizationError,
    ReferenceFallbackWarning,
    SimulationError,
    StagecError,
    TilingError,
    TimingError,
    UnsupportedOpError,
    VerificationError,
)
from stagec.isa import HardwareConfig, Program

from .api import compile, load, simulate  # noqa: A004
from .codesign import Codesign, codesign
from .report import Report
from .tuning import TuneSettings, Tuning, tune

__all__ = ["AssemblyError", "Codesign", "ConfigError", "ExportError", "HardwareConfig", "InputError",
           "LoweringError", "PlanError", "Program", "ProgramFormatError", "QuantizationError",
           "ReferenceFallbackWarning", "Report", "SimulationError", "StagecError", "TilingError", "TimingError",
           "TuneSettings", "Tuning", "UnsupportedOpError", "VerificationError", "codesign", "compile", "load",
           "simulate", "tune"]
__version__ = "0.1.0"
