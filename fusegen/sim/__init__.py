"""fusegen.sim: a CPU interpreter of NKI kernels with hardware-limit checks and an instruction trace."""

from .binding import installed, load_module
from .errors import (
    AccumulateError,
    BarrierError,
    CapacityError,
    DtypeError,
    EngineMemoryError,
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
from .targets import TARGETS, Target, get_target
from .trace import Record, Trace

__all__ = [
    "TARGETS",
    "AccumulateError",
    "BarrierError",
    "CapacityError",
    "DtypeError",
    "EngineMemoryError",
    "InvalidArgumentError",
    "Kernel",
    "MatmulShapeError",
    "OutOfBoundsError",
    "PartitionError",
    "RaceError",
    "Record",
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
