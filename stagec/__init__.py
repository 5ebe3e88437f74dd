"""stagec: a staged compiler, hosted in JAX, for on-device ML accelerators.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
    >>> x = torch.randn(1, 3, 16, 16)
    >>> program = stagec.compile(model, (x,))          # torch.export -> jaxpr -> instructions
    >>> y, report = stagec.simulate(program, x)        # run on the simulated accelerator
"""

from stagec.isa import HardwareConfig, Program, VerificationError
from stagec.sim.reference import SimulationError

from .api import compile, load, simulate  # noqa: A004
from .codesign import Codesign, codesign
from .report import Report
from .tuning import TuneSettings, Tuning, tune

__all__ = ["Codesign", "HardwareConfig", "Program", "Report", "SimulationError", "TuneSettings", "Tuning",
           "VerificationError", "codesign", "compile", "load", "simulate", "tune"]
__version__ = "0.1.0"
