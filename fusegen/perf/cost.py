"""Per-instruction cost model: engine cycles from documented data-path rules, DMA time from bytes and rows.

Every figure comes from the NKI notes in shared/reference/nki.md §5/§6 or the AWS Neuron SDK pages named
next to it (docs/performance.md has the derivations); the uncertain ones are in `ASSUMED`.
`instruction_cost` is a plain function over numbers so the tile planner can price plans without a
trace; `record_cost` adapts an interpreter trace Record to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from fusegen.perf import dmarule
from fusegen.sim.targets import Target
from fusegen.sim.trace import Operand, Record

#: minimum initiation interval of a compute instruction, in engine cycles [v2 arch guide], nki_perf_guide.rst
MIN_II_CYCLES = 64
#: static overhead before a dependent instruction on another engine sees a result (semaphore hand-off),
#: in the producer's cycles: "~100 cycles static overhead for small dependent instructions" [v2 arch guide]
SYNC_OVERHEAD_CYCLES = 100
#: fixed latency of one DMA transfer [SDK: nki-dma-bandwidth-guide.rst]
DMA_FIXED_NS = 1300.0
#: DMA engines (queues) per NeuronCore, each serving a share of the bandwidth [SDK: nki-dma-overview.rst]
DMA_QUEUES = 16
#: each DMA engine serves 8 partitions of a 128-partition transfer, so a transfer spreads over up to
#: 16 queues [SDK: nki-dma-overview.rst]
PARTITIONS_PER_DMA_QUEUE = 8
#: DMA transpose runs at <=90% (HBM->SBUF) / <=50% (SBUF->SBUF) of copy bandwidth [v3 arch guide]
DMA_TRANSPOSE_FACTOR = {True: 0.9, False: 0.5}  # keyed by "source is HBM"
#: fp32 matmul passes take 4x the bf16/fp16/tf32/fp8 time [SDK@2.26 isa cost tables], [v2], [v3]
FP32_MATMUL_FACTOR = 4
#: trn2 Vector "perf mode" (bf16/fp16, SBUF): tensor_copy/tensor_scalar up to 4x, tensor_tensor 2x [v3]
PERF_MODE_SPEEDUP = {"tensor_copy": 4, "tensor_scalar": 4, "tensor_tensor": 2}
HALF_DTYPES = frozenset({"bfloat16", "float16"})
#: fp8 matmul inputs take the bf16 time per instruction, "max(min(64, N_stat), N_mov) bf16/fp16/tf32/fp8"
#: [SDK@2.26 isa cost tables], [v3]; trn2's 158 fp8 TFLOPS (2x bf16 [v3]) come from perf_mode=double_row
#: (K=256 per instruction, same time), which generated kernels do not emit. ASSUMED.fp8_matmul_factor
#: scales it for the fp8 bench's sensitivity (FP8_SENSITIVITY).
FP8_DTYPES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"})  # fnuz: the sim's legacy e4m3
#: Tensor-engine dI/dt throttling (trn2, trn3): after an idle window the PE starts at ~50% of its peak
#: utilisation and ramps to full over ~3 us; the limit re-engages when utilisation over any ~3 us window
#: drops below 50% [SDK: tools/neuron-explorer/glossary.rst, "Throttling"]
PE_COLD_UTILISATION = 0.5
PE_RAMP_NS = 3000.0
#: a hardware-DGE DMA instruction takes ~600 ns to execute; NeuronCore-v3 has two DGE instances
#: [SDK: nki-dge.rst, trainium2_arch.rst]. Whether neuronx-cc gives a `dge_mode=unknown` transfer (what
#: generated kernels issue) hardware DGE or static descriptors ("zero on-device overhead") is not
#: documented, so the cost is off by default (ASSUMED.dge_issue_ns) and shown as a sensitivity.
HWDGE_ISSUE_NS = 600.0
HWDGE_INSTANCES = 2
#: core-to-core exchanges of LNC 2 (nki.isa sendrecv / sendrecv_compute run on DMA engines, SBUF to SBUF).
#: No rate of their own is published: an exchange is charged as a DMA of its bytes on the sending core's
#: queues (sendrecv_compute's engine also reads the receiving core's tile: twice the bytes read) at the DMA
#: rate and fixed cost, times ASSUMED.exchange_factor, which the FFN bench varies +-50%
EXCHANGE_OPS = frozenset({"sendrecv", "sendrecv_compute"})


@dataclass
class Assumptions:
    """The model's uncertain figures, changeable for a sensitivity run (`assume`); see docs/performance.md."""

    dma_row_bytes: int = dmarule.DMA_ROW_BYTES  # DMA packet-rate rule (fusegen/perf/dmarule.py)
    pe_throttle: bool = True  # model the Tensor engine's dI/dt ramp on NeuronCore-v3+
    dge_issue_ns: float = 0.0  # issue time of a DMA on one of the core's hardware DGEs (0: not modelled)
    fp8_matmul_factor: float = 1.0  # time of a matmul with an fp8 input, relative to bf16 (FP8_DTYPES)
    exchange_factor: float = 1.0  # core-to-core exchange time relative to a DMA of its bytes (EXCHANGE_OPS)


ASSUMED = Assumptions()
#: the benches' sensitivity runs: each uncertain figure varied alone (label, `assume` arguments)
SENSITIVITY: tuple[tuple[str, dict[str, float | bool]], ...] = (
    ("DMA row bytes x0.5", {"dma_row_bytes": dmarule.DMA_ROW_BYTES // 2}),
    ("DMA row bytes x1.5", {"dma_row_bytes": dmarule.DMA_ROW_BYTES * 3 // 2}),
    ("no PE throttling", {"pe_throttle": False}),
    ("HWDGE issue 600 ns per DMA", {"dge_issue_ns": HWDGE_ISSUE_NS}),
)
#: the fp8 bench's sensitivity: the fp8 matmul rate +-50% (the documented figure is 1x bf16's)
FP8_SENSITIVITY: tuple[tuple[str, dict[str, float | bool]], ...] = (
    ("fp8 matmul time x0.5", {"fp8_matmul_factor": 0.5}),
    ("fp8 matmul time x1.5", {"fp8_matmul_factor": 1.5}),
)
#: the FFN bench's sensitivity to the unpublished core-to-core rate: exchange time +-50%
EXCHANGE_SENSITIVITY: tuple[tuple[str, dict[str, float | bool]], ...] = (
    ("exchange time x0.5", {"exchange_factor": 0.5}),
    ("exchange time x1.5", {"exchange_factor": 1.5}),
)
#: the cost model before issue 15 (no DMA packet rule, no throttling), for before/after comparisons
MODEL_I: dict[str, float | bool] = {"dma_row_bytes": 0, "pe_throttle": False}


@contextlib.contextmanager
def assume(**changes: float | bool) -> Iterator[Assumptions]:
    """Within the block the cost model uses `changes` (e.g. dma_row_bytes=3675) instead of its figures."""
    saved = dataclasses.replace(ASSUMED)
    for name, value in changes.items():
        if not hasattr(ASSUMED, name):
            raise ValueError(f"no model assumption named {name!r}")
        setattr(ASSUMED, name, value)
    compute_cost.cache_clear()  # its cached costs were priced under the old figures
    try:
        yield ASSUMED
    finally:
        for name in changes:
            setattr(ASSUMED, name, getattr(saved, name))
        compute_cost.cache_clear()


class Shape(NamedTuple):
    """What a cycle rule needs to know of one instruction."""

    partitions: int
    elems: int  # elements per partition (moving free size for matmul)
    stationary: int  # matmul stationary free size (0 otherwise)
    dtype: str  # dtype of the main input
    psum_input: bool  # one input lives in PSUM
    reduce: bool  # activation also reduces into a register
    perf_mode: bool  # trn2 Vector fast path applies (bf16/fp16, all operands in SBUF)
    fp8: bool = False  # a matmul with an fp8 input


@dataclass(frozen=True, slots=True)
class Cost:
    """busy_ns: how long the engine/queue is occupied; latency_ns: until dependents may use the result."""

    busy_ns: float
    latency_ns: float


CycleRule = Callable[[Shape], float]


def _matmul(s: Shape) -> float:
    # max(min(64, N_stat), N_mov), x4 for fp32 [SDK@2.26 isa cost tables], [v2], [v3]
    factor: float = FP32_MATMUL_FACTOR if s.dtype == "float32" else 1
    if s.fp8:
        factor = ASSUMED.fp8_matmul_factor
    return max(min(64, s.stationary), s.elems) * factor


def _pe_transpose(s: Shape) -> float:
    # max(P, min(64, F)) of the input [P, F]; the record holds the [F, P] output [SDK@2.26 isa cost tables]
    return max(s.elems, min(64, s.partitions))


def _activation(s: Shape) -> float:
    # max(64, N), +~64 for the accumulator read when reducing [SDK@2.26 isa cost tables], [v2]
    return max(64, s.elems) + (64 if s.reduce else 0)


def _per_elem(factor: float, op: str = "") -> CycleRule:
    """factor x N cycles, less the trn2 perf-mode speedup of `op` [SDK@2.26 isa cost tables], [v3]."""

    def rule(s: Shape) -> float:
        speedup = PERF_MODE_SPEEDUP.get(op, 1) if s.perf_mode else 1
        return factor * s.elems / speedup

    return rule


def _tensor_tensor(s: Shape) -> float:
    # 2N, or N with one input in PSUM [SDK@2.26 isa cost tables]; perf mode 2x [v3]
    return s.elems if s.psum_input else _per_elem(2, "tensor_tensor")(s)


def _tensor_reduce(s: Shape) -> float:
    # N, N/2 for bf16 add/max [SDK@2.26 isa cost tables]
    return s.elems / 2 if s.dtype == "bfloat16" else s.elems


def _gpsimd(s: Shape) -> float:
    # ~150 + N [SDK@2.26 isa cost tables]
    return 150 + s.elems


#: (engine, op) -> cycles before the initiation-interval floor; (engine, "*") is the engine's default.
CYCLE_RULES: dict[tuple[str, str], CycleRule] = {
    ("tensor", "nc_matmul"): _matmul,
    ("tensor", "nc_transpose"): _pe_transpose,
    ("scalar", "activation"): _activation,
    ("scalar", "*"): _per_elem(1),  # tensor_copy/tensor_scalar on ACT: as activation, max(64, N)
    ("vector", "tensor_scalar"): _per_elem(1, "tensor_scalar"),
    ("vector", "tensor_copy"): _per_elem(1, "tensor_copy"),
    ("vector", "tensor_tensor"): _tensor_tensor,
    ("vector", "scalar_tensor_tensor"): _per_elem(2),
    ("vector", "tensor_reduce"): _tensor_reduce,
    ("vector", "reciprocal"): _per_elem(8),
    ("vector", "memset"): _per_elem(1),
    ("vector", "nc_transpose"): _per_elem(1),
    ("vector", "*"): _per_elem(1),  # bn_stats/bn_aggr: no published figure; assumed one pass, N
    ("gpsimd", "*"): _gpsimd,
}
#: ops that only synchronise: no engine time of their own
ZERO_COST_OPS = frozenset({"core_barrier"})


def engine_clock_ghz(target: Target, engine: str) -> float:
    """The clock of a compute engine (ValueError when the target table has none)."""
    clock = {"tensor": target.tensor_clock_ghz, "vector": target.vector_clock_ghz,
             "scalar": target.scalar_clock_ghz, "gpsimd": target.gpsimd_clock_ghz}.get(engine)  # fmt: skip
    if clock is None:
        raise ValueError(
            f"no clock figure for the {engine} engine of {target.name} in fusegen/sim/targets.py"
        )
    return clock


def dma_queue_bytes_per_ns(target: Target) -> float:
    """Bandwidth of one DMA queue: the core's DMA bandwidth over its 16 engines (trn2 23, trn1 17 B/ns)."""
    if target.dma_gbps_per_core is None:
        raise ValueError(f"no DMA bandwidth figure for {target.name} in fusegen/sim/targets.py")
    return target.dma_gbps_per_core / DMA_QUEUES


def dma_queues_used(partitions: int) -> int:
    """Queues one transfer spreads over: one per 8 partitions of its on-chip side, at most 16."""
    return max(1, min(DMA_QUEUES, -(-partitions // PARTITIONS_PER_DMA_QUEUE)))


def dma_cost(target: Target, nbytes: int, partitions: int = 128, transpose: bool = False,
             from_hbm: bool = True, on_chip: bool = True) -> Cost:  # fmt: skip
    """One transfer: each of its queues is busy for its share of the bytes at its bandwidth, but at least the
    packet time of each SBUF partition row it moves (`dmarule`; an HBM-to-HBM copy has none: no figure is
    published for it); the fixed cost is pipelined latency."""
    queues = dma_queues_used(partitions)
    rate = dma_queue_bytes_per_ns(target)
    if transpose:
        rate *= DMA_TRANSPOSE_FACTOR[from_hbm]
    rows = partitions if on_chip else 0
    busy = dmarule.dma_engine_bytes(nbytes, rows, queues, ASSUMED.dma_row_bytes) / rate
    return Cost(busy, busy + DMA_FIXED_NS)


def dge_issue_ns(target: Target) -> float:
    """How long issuing one DMA holds a hardware DGE of `target` (0 when not modelled or no HWDGE)."""
    return ASSUMED.dge_issue_ns if target.nc_version >= 3 else 0.0


def pe_utilisation_limit(target: Target, since_ramp_ns: float) -> float:
    """Share of its peak the Tensor engine may run at `since_ramp_ns` after its dI/dt ramp began (1.0 when
    the target does not throttle or the ramp is over)."""
    if target.nc_version < 3 or not ASSUMED.pe_throttle:
        return 1.0
    return PE_COLD_UTILISATION + (1 - PE_COLD_UTILISATION) * min(1.0, since_ramp_ns / PE_RAMP_NS)


@functools.lru_cache(maxsize=4096)  # traces repeat a few shapes thousands of times
def compute_cost(target: Target, engine: str, op: str, shape: Shape) -> Cost:
    """Cycles of a compute instruction by its rule, floored at the initiation interval, in ns."""
    if op in ZERO_COST_OPS:
        return Cost(0.0, 0.0)
    rule = CYCLE_RULES.get((engine, op)) or CYCLE_RULES.get((engine, "*"))
    if rule is None:
        raise ValueError(f"no cost rule for {op} on the {engine} engine")
    clock = engine_clock_ghz(target, engine)
    busy = max(MIN_II_CYCLES, rule(shape)) / clock
    return Cost(busy, busy + SYNC_OVERHEAD_CYCLES / clock)


def instruction_cost(
    target: Target, engine: str, op: str, partitions: int, elems: int, dtype: str = "bfloat16", *,
    stationary: int = 0, psum_input: bool = False, reduce: bool = False, perf_mode: bool = False,
    nbytes: int = 0, from_hbm: bool = True,
) -> Cost:  # fmt: skip
    """Cost of one instruction described by numbers (DMA: `nbytes` moved over `partitions`; matmul: `elems`
    is the moving free size N, `stationary` the stationary free size)."""
    if engine == "dma":
        return dma_cost(target, nbytes, partitions, transpose=op == "dma_transpose", from_hbm=from_hbm)
    shape = Shape(
        partitions, elems, stationary, dtype, psum_input, reduce, perf_mode and target.nc_version >= 3
    )
    return compute_cost(target, engine, op, shape)


def instruction_ns(target: Target, engine: str, op: str, partitions: int, elems: int, dtype: str = "bfloat16",
                   **details: int | bool) -> float:  # fmt: skip
    """Engine-occupancy time of one instruction in ns; see instruction_cost for `details`."""
    return instruction_cost(target, engine, op, partitions, elems, dtype, **details).busy_ns  # type: ignore[arg-type]


def record_cost(target: Target, rec: Record) -> Cost:
    """Cost of one trace record."""
    if rec.op in ZERO_COST_OPS or not rec.operands:
        return Cost(0.0, 0.0)
    if rec.engine == "dma":
        moved = max(rec.hbm_read + rec.sbuf_read, rec.hbm_write + rec.sbuf_write)
        cost = dma_cost(target, moved, rec.partitions, transpose=rec.op == "dma_transpose",
                        from_hbm=rec.hbm_read > 0, on_chip=rec.sbuf_read + rec.sbuf_write > 0)  # fmt: skip
        if rec.op in EXCHANGE_OPS:
            busy = cost.busy_ns * ASSUMED.exchange_factor
            return Cost(busy, busy + DMA_FIXED_NS)
        return cost
    return compute_cost(target, rec.engine, rec.op, record_shape(target, rec))


def record_shape(target: Target, rec: Record) -> Shape:
    """The cost-relevant facts of a compute record, read from its operands in one pass."""
    reads: list[Operand] = []
    writes = 0
    half_on_sbuf = target.nc_version >= 3
    for op in rec.operands:
        if op[0] == "r":
            reads.append(op)
        else:
            writes += 1
        half_on_sbuf = half_on_sbuf and op[2] == "sbuf" and op[4] in HALF_DTYPES
    matmul = rec.op == "nc_matmul" and len(reads) > 1
    main = reads[1] if matmul else (reads[0] if reads else rec.operands[0])
    return Shape(
        partitions=rec.partitions, elems=rec.elems, stationary=_free_size(reads[0][3]) if matmul else 0,
        dtype=main[4], psum_input=any(op[2] == "psum" for op in reads), reduce=writes > 1,
        perf_mode=half_on_sbuf, fp8=matmul and any(op[4] in FP8_DTYPES for op in reads),
    )  # fmt: skip


def _free_size(shape: tuple[int, ...]) -> int:
    """Elements per partition of an operand shape."""
    size = 1
    for n in shape[1:]:
        size *= n
    return size
