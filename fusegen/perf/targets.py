"""`fusegen targets`: the hardware figures each target offers the planner and the cost model."""

from __future__ import annotations

from typing import Any

from fusegen.jsonout import document, emit
from fusegen.sim.targets import TARGETS, Target

#: Where the figures come from (the tags in fusegen/sim/targets.py; shared/reference/nki.md §5, §6).
SOURCES = (
    "SBUF/PSUM: AWS Neuron SDK architecture guides (trainium_inferentia2_arch.rst, trainium2_arch.rst); "
    "usable SBUF: nkipy HardwareConstants.h; clocks: the same architecture guides; HBM: trainium.rst, "
    "trainium2.rst; DMA: nki-dma-bandwidth-guide.rst"
)


def complete(target: Target) -> bool:
    """Whether every figure the cost model and the FFN planner need is known (trn3's clocks are not)."""
    figures = (target.tensor_clock_ghz, target.vector_clock_ghz, target.scalar_clock_ghz,
               target.gpsimd_clock_ghz, target.hbm_gbps_per_chip, target.dma_gbps_per_core)  # fmt: skip
    return all(f is not None for f in figures)


def offered() -> tuple[str, ...]:
    """The targets `--target` accepts."""
    return tuple(name for name, t in TARGETS.items() if complete(t))


def _row(t: Target) -> dict[str, Any]:
    return {
        "name": t.name,
        "offered": complete(t),
        "nc_version": t.nc_version,
        "partitions": t.partitions,
        "sbuf_bytes_per_partition": t.sbuf_bytes_per_partition,
        "sbuf_usable_bytes_per_partition": t.sbuf_usable_bytes,
        "psum_banks": t.psum_banks,
        "psum_bank_bytes": t.psum_bank_bytes,
        "max_lnc": t.max_lnc,
        "clock_ghz": {
            "tensor": t.tensor_clock_ghz,
            "vector": t.vector_clock_ghz,
            "scalar": t.scalar_clock_ghz,
            "gpsimd": t.gpsimd_clock_ghz,
        },
        "hbm_gbps_per_chip": t.hbm_gbps_per_chip,
        "dma_gbps_per_core": t.dma_gbps_per_core,
        "cores_per_chip": t.cores_per_chip,
    }


def list_targets(fmt: str = "text") -> int:
    """Print every target's figures; targets missing a figure are listed as not offered."""
    rows = [_row(t) for t in TARGETS.values()]
    if fmt == "json":
        emit(document("targets", True, targets=rows, sources=SOURCES))
        return 0
    for r in rows:
        clocks = r["clock_ghz"]
        clock = " / ".join(_figure(clocks[e]) for e in clocks)
        state = "" if r["offered"] else "  (not offered: clock and bandwidth figures unknown)"
        print(f"{r['name']}: NeuronCore-v{r['nc_version']}, LNC up to {r['max_lnc']}{state}")
        print(f"  SBUF   {r['sbuf_bytes_per_partition'] // 1024} KiB per partition x {r['partitions']}, "
              f"{r['sbuf_usable_bytes_per_partition']:,} B usable by a kernel")  # fmt: skip
        print(f"  PSUM   {r['psum_banks']} banks x {r['psum_bank_bytes']} B per partition")
        print(f"  clocks tensor / vector / scalar / gpsimd {clock} GHz")
        hbm, dma = (_figure(r[k]) for k in ("hbm_gbps_per_chip", "dma_gbps_per_core"))
        print(f"  memory HBM {hbm} GB/s per chip ({r['cores_per_chip']} cores), DMA {dma} GB/s per core")
    print(f"sources: {SOURCES}")
    return 0


def _figure(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"
