"""fusegen.sim: a CPU interpreter of NKI kernels with hardware-limit checks and an instruction trace."""

from .binding import installed, load_module
from .errors import (
    AccumulateError,
    BarrierError,
    CapacityError,
    DtypeError,
    EngineMemoryError,
    InputRangeError,
    InvalidArgumentError,
    MatmulShapeError,
    OutOfBoundsError,
    PartitionError,
    RaceError,
    ShapeMismatchError,
    SimError,
    UninitializedReadError,
    UninitializedReadWarning,
    UnsupportedError,
)
from .launch import Kernel, RunResult, run
from .rules import RULES, ConformanceWarning, LanguageError, Rule
from .targets import TARGETS, Target, get_target
from .trace import Record, Trace

__all__ = [
    "RULES",
    "TARGETS",
    "AccumulateError",
    "BarrierError",
    "CapacityError",
    "ConformanceWarning",
    "DtypeError",
    "EngineMemoryError",
    "InputRangeError",
    "InvalidArgumentError",
    "Kernel",
    "LanguageError",
    "MatmulShapeError",
    "OutOfBoundsError",
    "PartitionError",
    "RaceError",
    "Record",
    "Rule",
    "RunResult",
    "ShapeMismatchError",
    "SimError",
    "Target",
    "Trace",
    "UninitializedReadError",
    "UninitializedReadWarning",
    "UnsupportedError",
    "get_target",
    "installed",
    "load_module",
    "run",
]
