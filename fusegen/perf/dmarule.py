"""The DMA packet-rate rule, shared by the trace cost model (fusegen/perf/cost.py) and the FFN planner.

Standard library only: the FFN planner's code is copied into every generated FFN kernel, and
`fusegen.codegen.files.render.vendored` copies this module's code with it (it follows the planner's import).
Sources and the derivation: docs/performance.md, "Instruction costs".
"""

from __future__ import annotations

#: Bytes per partition from which a 128-partition transfer runs at the DMA engines' peak rate. Below it the
#: engines are bound by packets (one per partition row), not bytes: each row occupies its engine as long as
#: this many bytes would at the peak rate. Read off the throughput figure of nki-dma-overview.rst
#: ("DMA Throughput varying Bytes per Partition for p_dim = 128"): throughput grows linearly up to 1 KiB
#: (42% of the 32 KiB rate there), 2 KiB reaches 81%, 4 KiB 97%; a linear rise that meets the peak at
#: 2,450 B fits every point within 4% of peak. The figure's y axis has no numbers and no generation is
#: named, so this constant is uncertain: bench/rows_perf.py and bench/ffn_perf.py show +-50%.
DMA_ROW_BYTES = 2450


def dma_engine_bytes(nbytes: float, rows: int, engines: int, row_bytes: int = DMA_ROW_BYTES) -> float:
    """What one transfer occupies on each of the `engines` DMA engines it spreads over, in bytes at the peak
    rate: its share of the bytes, but at least `row_bytes` for each of the `rows` partition rows (packets)
    that engine moves."""
    return max(nbytes / engines, -(-rows // engines) * row_bytes)
