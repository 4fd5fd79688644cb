"""Roofline of a kernel: the larger of its PE time at peak and its minimum HBM traffic at full bandwidth."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fusegen.dsl.ir import KernelIR
from fusegen.dsl.ir import matmul_flops as ir_matmul_flops
from fusegen.perf.cost import FP32_MATMUL_FACTOR
from fusegen.sim.targets import Target
from fusegen.sim.trace import Record

#: physical NeuronCores per chip, sharing the chip's HBM: trn1 2, trn2 8 [SDK: trainium.rst, trainium2.rst]
#: one 128-element moving column through the 128x128 PE array per cycle, 2 FLOP per MAC
#: (128 x 128 x 2 x 2.4 GHz = 78.6 TFLOPS on trn2, 91.8 on trn1: nki.md §6 "derived check")
PE_FLOPS_PER_CYCLE = 2 * 128 * 128


@dataclass(frozen=True)
class Roofline:
    """Lower bounds on a kernel's time from compute and from memory, per launch over `lnc` cores."""

    flops: float
    min_hbm_bytes: int
    pe_peak_flops_per_ns: float  # all cores of the launch
    hbm_bytes_per_ns: float  # all cores of the launch

    @property
    def compute_ns(self) -> float:
        """Time at PE peak."""
        return self.flops / self.pe_peak_flops_per_ns

    @property
    def memory_ns(self) -> float:
        """Time to read every input once and write every output once."""
        return self.min_hbm_bytes / self.hbm_bytes_per_ns

    @property
    def time_ns(self) -> float:
        """The roofline time: the larger bound."""
        return max(self.compute_ns, self.memory_ns)

    @property
    def bound(self) -> str:
        """Which roof binds: 'PE' or 'HBM'."""
        return "PE" if self.compute_ns >= self.memory_ns else "HBM"

    def efficiency(self, modeled_ns: float) -> float:
        """Roofline time over modelled time (1.0 = at the roofline)."""
        return self.time_ns / modeled_ns if modeled_ns > 0 else 0.0


def pe_peak_flops_per_ns(target: Target, fp32: bool = False) -> float:
    """Dense PE peak of one physical core in FLOP/ns; fp32 at a quarter [SDK@2.26 isa cost tables]."""
    if target.tensor_clock_ghz is None:
        raise ValueError(f"no Tensor-engine clock for {target.name} in fusegen/sim/targets.py")
    peak = PE_FLOPS_PER_CYCLE * target.tensor_clock_ghz
    return peak / FP32_MATMUL_FACTOR if fp32 else peak


def hbm_bytes_per_ns(target: Target) -> float:
    """One physical core's share of the chip's HBM bandwidth (trn2 2.9 TB/s / 8, trn1 820 GB/s / 2)."""
    if target.hbm_gbps_per_chip is None:
        raise ValueError(f"no HBM bandwidth figure for {target.name}")
    return target.hbm_gbps_per_chip / target.cores_per_chip


def matmul_flops(records: Iterable[Record]) -> tuple[float, bool]:
    """(FLOPs of every nc_matmul, whether any ran in fp32): 2 x K x M x N per instruction."""
    flops, fp32 = 0.0, False
    for rec in records:
        if rec.op != "nc_matmul":
            continue
        stationary, moving = (op for op in rec.operands if op[0] == "r")
        flops += 2 * stationary[3][0] * rec.partitions * rec.elems
        fp32 = fp32 or moving[4] == "float32"
    return flops, fp32


def spec_flops(ir: KernelIR, dims: Mapping[str, int]) -> float:
    """FLOPs of the spec's own matmuls at `dims`: the math's work, without the identity matmuls a kernel
    adds to transpose or stage rows on the Tensor engine."""
    return float(ir_matmul_flops(ir.nodes, dims))


def roofline(target: Target, lnc: int, flops: float, min_hbm_bytes: int, fp32: bool = False) -> Roofline:
    """The roofline of a launch over `lnc` physical cores."""
    return Roofline(
        flops, min_hbm_bytes, pe_peak_flops_per_ns(target, fp32) * lnc, hbm_bytes_per_ns(target) * lnc
    )


def hbm_bytes_moved(records: Iterable[Record]) -> int:
    """HBM bytes the trace actually moved (reads + writes)."""
    return sum(rec.hbm_read + rec.hbm_write for rec in records)
