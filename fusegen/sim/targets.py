"""Per-target hardware constants (trn1, trn2, trn3) shared by the interpreter and the tile planner.

Every value carries its source tag from the NKI notes in shared/reference/nki.md (§5 limits, §6 cost figures);
`None` marks a figure the reference does not give.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Target:
    """Hardware limits and speeds of one NeuronCore generation (figures per physical core)."""

    name: str
    nc_version: int  # NeuronCore generation: 2 = trn1, 3 = trn2, 4 = trn3
    partitions: int
    sbuf_bytes_per_partition: int  # physical SBUF per partition
    sbuf_usable_bytes: int  # budget per partition a kernel may allocate
    psum_banks: int
    psum_bank_bytes: int  # per partition
    matmul_k_max: int  # contraction (partition dim of both operands)
    matmul_m_max: int  # stationary free size
    matmul_n_max: int  # moving free size (fp32 elements that fit the PSUM output limit)
    bn_stats_fmax: int
    supports_hwdge: bool
    tensor_clock_ghz: float | None
    vector_clock_ghz: float | None
    scalar_clock_ghz: float | None
    gpsimd_clock_ghz: float | None
    hbm_gbps_per_chip: float | None
    dma_gbps_per_core: float | None
    cores_per_chip: int  # physical NeuronCores sharing the chip's HBM bandwidth

    def __hash__(self) -> int:
        """Hash of every field, computed once: targets key caches looked up at every instruction (two
        targets of one name but other limits are different keys)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = hash(tuple(getattr(self, f.name) for f in fields(self)))
        return int(cached)

    def __getstate__(self) -> dict[str, object]:
        """The fields without the cached hash: str hashes differ between processes (PYTHONHASHSEED), so a
        hash carried into a multiprocessing or pytest-xdist worker would be wrong there."""
        return {name: value for name, value in self.__dict__.items() if name != "_hash"}

    @property
    def max_lnc(self) -> int:
        """The largest LNC degree: LNC=2 pairs NeuronCore-v3+ cores; trn1 has no logical cores."""
        return 2 if self.nc_version >= 3 else 1

    @property
    def exact_transpose(self) -> bool:
        """Is a Tensor-engine nc_transpose an exact copy (NeuronCore-v3 on), not an identity matmul whose
        0 x inf = nan spreads a non-finite element through its column (ISA nc_transpose)?"""
        return self.nc_version >= 3

    @property
    def psum_bytes_per_partition(self) -> int:
        """Total PSUM bytes per partition."""
        return self.psum_banks * self.psum_bank_bytes


TARGETS: dict[str, Target] = {
    "trn1": Target(
        name="trn1",
        nc_version=2,
        partitions=128,  # [SDK: trainium_inferentia2_arch.rst]
        sbuf_bytes_per_partition=192 * 1024,  # 24 MiB = 128 x 192 KiB [arch guide]
        sbuf_usable_bytes=180_224,  # [NKIPY: HardwareConstants.h]
        psum_banks=8,  # 2 MiB = 128 x 16 KiB, 8 x 2 KiB banks [arch guide]
        psum_bank_bytes=2048,
        matmul_k_max=128,  # nc_matmul K<=128, M<=128, N<=512 on v2/v3 [SDK: isa stubs]
        matmul_m_max=128,
        matmul_n_max=512,
        bn_stats_fmax=512,  # [arch guide]
        supports_hwdge=False,  # hwdge needs NeuronCore-v3+ [SDK: isa dma_copy]
        tensor_clock_ghz=2.8,  # [v2 arch guide]
        vector_clock_ghz=1.12,
        scalar_clock_ghz=1.4,
        gpsimd_clock_ghz=1.4,
        hbm_gbps_per_chip=820.0,  # [SDK: trainium.rst]
        dma_gbps_per_core=272.0,  # 16 x 17 B/ns [SDK: nki-dma-bandwidth-guide.rst]
        cores_per_chip=2,  # [SDK: trainium.rst] 2 NC-v2 per chip
    ),
    "trn2": Target(
        name="trn2",
        nc_version=3,
        partitions=128,
        sbuf_bytes_per_partition=224 * 1024,  # 28 MiB = 128 x 224 KiB [trainium2_arch.rst]
        sbuf_usable_bytes=212_984,  # [NKIPY: HardwareConstants.h]
        psum_banks=8,
        psum_bank_bytes=2048,
        matmul_k_max=128,
        matmul_m_max=128,
        matmul_n_max=512,
        bn_stats_fmax=512,
        supports_hwdge=True,
        tensor_clock_ghz=2.4,  # [v3 arch guide]
        vector_clock_ghz=0.96,
        scalar_clock_ghz=1.2,
        gpsimd_clock_ghz=1.2,
        hbm_gbps_per_chip=2900.0,  # [SDK: trainium2.rst]
        dma_gbps_per_core=368.0,  # 16 x 23 B/ns [SDK: nki-dma-bandwidth-guide.rst]
        cores_per_chip=8,  # [SDK: trainium2.rst] 8 NC-v3 per chip
    ),
    "trn3": Target(
        name="trn3",
        nc_version=4,
        partitions=128,
        sbuf_bytes_per_partition=256 * 1024,  # inferred: usable budget + reserve, not in the reference
        sbuf_usable_bytes=245_752,  # [NKIPY: HardwareConstants.h]
        psum_banks=8,
        psum_bank_bytes=2048,
        matmul_k_max=128,
        matmul_m_max=128,
        matmul_n_max=512,  # v4 allows wider outputs; kept at one bank until modelled
        bn_stats_fmax=512,
        supports_hwdge=True,
        tensor_clock_ghz=None,
        vector_clock_ghz=None,
        scalar_clock_ghz=None,
        gpsimd_clock_ghz=None,
        hbm_gbps_per_chip=None,
        dma_gbps_per_core=None,
        cores_per_chip=8,  # [SDK: trainium3.rst] 8 NC-v4 per device
    ),
}


def get_target(name: str) -> Target:
    """Look a target up by name ('trn1', 'trn2', 'trn3')."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None
