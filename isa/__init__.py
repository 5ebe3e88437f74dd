"""The contract between compiler and hardware: config, instructions, programs, verifier.

`isa` depends on nothing else of stagec.
"""

from .assembly import AssemblyError, assemble, disassemble
from .config import ConfigError, HardwareConfig
from .instructions import (
    AccMode,
    DType,
    Instruction,
    Opcode,
    Operand,
    PadValue,
    Queue,
    Space,
    VectorFunc,
    load,
    matmul,
    store,
    vector,
)
from .program import Layer, Program, ProgramFormatError, Region, RegionKind, TensorRef
from .verify import VerificationError, verify

__all__ = [
    "AccMode", "AssemblyError", "ConfigError", "DType", "HardwareConfig", "Instruction", "Layer", "Opcode",
    "Operand", "PadValue", "Program", "ProgramFormatError", "Queue", "Region", "RegionKind", "Space",
    "TensorRef", "VectorFunc", "VerificationError", "assemble", "disassemble", "load", "matmul", "store",
    "vector", "verify",
]
