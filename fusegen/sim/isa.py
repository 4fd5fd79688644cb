"""`nki.isa` (nisa): the instruction set, enums and version query, bound to the interpreter."""

from __future__ import annotations

from .conformance import violation
from .context import active_target, current
from .errors import API_NAMES, InvalidArgumentError, SimError, unmodelled_names
from .instr import Instr
from .isa_compute import (  # noqa: F401 -- the public nisa surface
    activation,
    activation_reduce,
    bn_aggr,
    bn_stats,
    reciprocal,
    scalar_tensor_tensor,
    tensor_reduce,
    tensor_scalar,
    tensor_tensor,
)
from .isa_lnc import barrier as _lnc_barrier
from .isa_lnc import sendrecv, sendrecv_compute  # noqa: F401
from .isa_matmul import nc_matmul  # noqa: F401
from .isa_move import dma_copy, dma_transpose, iota, memset, nc_transpose, tensor_copy  # noqa: F401
from .memory import MemoryRegion
from .operands import engine_name
from .ops import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd  # noqa: F401
from .tensor import NkiTensor

NkiValidationError = SimError

#: the other functions of AWS's `nki.isa` stub (nki/api/nki/isa/__init__.py): legal NKI the interpreter does
#: not model, so a kernel calling one gets an UnsupportedError at its line (docs/sim.md), not AttributeError
_UNMODELLED = frozenset({
    "activate2", "affine_select", "dma_compute", "dropout", "exponential", "get_nc_sub_version",
    "local_gather", "max8", "nc_find_index8", "nc_match_replace8", "nc_matmul_mx", "nc_n_gather",
    "nc_stream_shuffle", "nonzero_with_count", "quantize_mx", "rand2", "rand_get_state", "rand_set_state",
    "range_select", "register_alloc", "register_load", "register_move", "register_store", "rng",
    "select_reduce", "sequence_bounds", "set_rng_seed", "tensor_copy_predicated", "tensor_partition_reduce",
    "tensor_scalar_cumulative", "tensor_scalar_reduce", "tensor_tensor_scan", "topk",
})  # fmt: skip
__getattr__ = unmodelled_names("nki.isa", _UNMODELLED)

tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def get_nc_version() -> nc_version:
    """NeuronCore generation of the active target."""
    return nc_version(active_target().nc_version)


def core_barrier(
    data: NkiTensor, cores: tuple[int, ...], engine: object = engine.gpsimd, name: object = None
) -> None:
    """Block until every listed core arrives; starts a new race-detection epoch of `data`'s tensor."""
    ins = Instr(
        "core_barrier", engine_name(engine, "gpsimd", ("gpsimd", "vector", "scalar", "sync"), "core_barrier")
    )
    t = ins.tensor(data, "data")
    if t.alloc.region is not MemoryRegion.shared_hbm:
        raise ins.fail(InvalidArgumentError, f"data must be in shared HBM, got {t.alloc.region.value}")
    launch = ins.ctx.launch
    if launch.target.nc_version < 3 or launch.grid != 2 or tuple(cores) != (0, 1):
        violation(
            ins,
            "core-barrier-lnc",
            f"cores={cores} in a {launch.grid}-instance launch on {launch.target.name}",
        )
    grid = launch.grid
    if not set(range(grid)) <= set(cores):
        raise ins.fail(
            InvalidArgumentError, f"cores={cores} must include every core of the launch {tuple(range(grid))}"
        )
    ins.finish(0, 0)
    ctx = current()
    _lnc_barrier(ins, t.alloc)  # counted with the exchanges, which meet on the same barrier
    ctx.epoch += 1
    if t.alloc.race is not None:  # orders accesses to `data` only [ISA core_barrier]
        t.alloc.race.barrier(ctx.core)


API_NAMES.update(name for name, value in list(globals().items()) if callable(value) and name[0] != "_")
