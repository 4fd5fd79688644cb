"""The documented NKI rules the interpreter enforces, as data: one named entry per rule, each with its source.

Sources are files of the public aws-neuron/aws-neuron-sdk repository (rendered on the Neuron docs site):
  ISA    nki/api/nki/isa/__init__.py (the docstring of the named nki.isa function)
  SH     nki/api/nki.api.shared.rst (ALU operator table, activation function table)
  SH2.26 the same repo at commit 49ee15c5, general/nki/api/nki.api.shared.rst (ALU table with its
         "Supported Engine" column, dropped from later versions)
  ARCH2  nki/guides/architecture/trainium_inferentia2_arch.rst; ARCH3 .../trainium2_arch.rst
  DGE    nki/deep-dives/nki-dge.rst; RN release-notes/components/nki.rst
  LNC    about-neuron/arch/neuron-features/logical-neuroncore-config.rst
  GUIDE  nki/get-started/nki-language-guide.rst; MIG nki/migration/index.rst
  CE     compiler/error-codes/<code>.rst (the compiler's error-code pages)
Where sources disagree the stricter reading is taken (the `text` says so). docs/sim.md lists the table;
conformance.py applies it.
A violation raises the rule's error class with `[rule-name]` in the message; with rules="warn" a rule not
marked `always` warns instead (ConformanceWarning, once per rule and source line per process) and the
instruction still runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import (
    DtypeError,
    EngineMemoryError,
    InputRangeError,
    InvalidArgumentError,
    PartitionError,
    SimError,
)


class LanguageError(SimError):
    """Kernel code uses a construct outside the Python subset NKI traces."""


class ConformanceWarning(UserWarning):
    """rules="warn": a documented rule was broken; the interpreter ran the instruction anyway."""


@dataclass(frozen=True)
class Rule:
    """One documented rule: its name (in every message), error class, statement and source.

    always: an error even with rules="warn" (checks the interpreter enforced before the rules mode existed).
    """

    name: str
    error: type[SimError]
    text: str
    source: str
    always: bool = False


RULE_LIST: tuple[Rule, ...] = (
    # ---- ALU operators ---------------------------------------------------------------------------
    Rule(
        "alu-no-divide",
        InvalidArgumentError,
        "divide, mod and fmod are not hardware instructions; multiply by a reciprocal",
        "RN (NKI Language known limitations); SH ALU table has no divide/mod",
    ),
    Rule(
        "alu-op-table",
        InvalidArgumentError,
        "an ALU `op` must be an operator of the ALU table",
        "SH tbl-aluop",
    ),
    Rule(
        "alu-engine",
        InvalidArgumentError,
        "an explicit engine= must be listed for every op in the ALU table's Supported Engine column",
        "SH2.26 tbl-aluop 'Supported Engine' (ops absent there: Vector only, our assumption)",
    ),
    Rule(
        "tensor-scalar-gpsimd",
        InvalidArgumentError,
        "tensor_scalar engine=gpsimd only for rsqrt (stricter than SH2.26, which also lists add/multiply)",
        "ISA tensor_scalar (engine parameter)",
    ),
    Rule(
        "scalar-engine-pairs",
        InvalidArgumentError,
        "tensor_scalar on the Scalar engine: trn2+ only, (multiply, add), (multiply, None), (add, None)",
        "ISA tensor_scalar; SH2.26 note (Scalar add/multiply from NeuronCore-v3)",
        always=True,
    ),
    Rule(
        "tensor-scalar-op-kinds",
        InvalidArgumentError,
        "tensor_scalar op0 and op1 are both bitvec or both arithmetic; bitvec runs on Vector only",
        "ISA tensor_scalar",
    ),
    Rule(
        "tensor-scalar-unary-operand",
        InvalidArgumentError,
        "a unary ALU op (abs, square, relu, rsqrt, reciprocal) takes operand None or 0",
        "ISA tensor_scalar (operand0)",
    ),
    Rule(
        "tensor-scalar-operand-fp32",
        DtypeError,
        "arithmetic tensor_scalar operands must be float32 (a number or an fp32 [P,1] tile)",
        "ISA tensor_scalar",
    ),
    Rule(
        "stt-arithmetic-only",
        InvalidArgumentError,
        "scalar_tensor_tensor takes arithmetic operators only, no bitvec",
        "ISA scalar_tensor_tensor",
    ),
    Rule(
        "bitvec-integer",
        DtypeError,
        "bitvec operators need integer input and output tiles (raw bit patterns)",
        "ISA tensor_tensor, tensor_scalar; SH tbl-aluop",
        always=True,
    ),
    Rule(
        "reduce-op-legal",
        InvalidArgumentError,
        "a reduction op must have 'Legal Reduction op' = Y in the ALU table",
        "SH tbl-aluop",
    ),
    # ---- activation ------------------------------------------------------------------------------
    Rule(
        "activation-table",
        InvalidArgumentError,
        "activation functions must be in the activation function table (no cos, tan, floor, ...)",
        "SH tbl-act-func; ISA activation",
    ),
    Rule(
        "activation-input-range",
        InputRangeError,
        "an activation's argument (data * scale + bias) lies in the function's Valid Input Range: log "
        "[2^-64, 2^64], sin [-pi, pi], arctan [-pi/2, pi/2], sqrt [2^-116, 2^118], rsqrt [2^-87, 2^97], "
        "reciprocal +-[2^-42, 2^42]; outside it the result is invalid (NaN is not checked)",
        "SH tbl-act-func (Valid Input Range and its note); ISA activation (note)",
    ),
    Rule(
        "activation-scale-fp32",
        DtypeError,
        "activation scale must be float32 (a number or an fp32 [P,1] tile)",
        "ISA activation (Data types)",
    ),
    Rule(
        "activation-reduce-add",
        InvalidArgumentError,
        "activation reduce_op must be nl.add (activation's docstring says so on every target; "
        "activation_reduce's says NeuronCore-v2: the stricter reading applies everywhere)",
        "ISA activation, activation_reduce",
    ),
    # ---- engines and memories --------------------------------------------------------------------
    Rule(
        "gpsimd-no-psum",
        EngineMemoryError,
        "the GpSimd engine cannot access PSUM (nl.power and int32 tensor_tensor run on GpSimd)",
        "ISA tensor_tensor, tensor_copy; ARCH2 memory hierarchy",
        always=True,
    ),
    Rule(
        "engine-free-size",
        PartitionError,
        "Vector/Scalar instructions: at most 64K elements per partition in SBUF, 4K in PSUM",
        "ARCH2 Vector Engine / Scalar Engine tile size",
    ),
    Rule(
        "start-partition",
        PartitionError,
        "compute-engine operands on >64 partitions start at 0; 33-64 at 0 or 64; <=32 at 0/32/64/96",
        "ARCH2 'Accessing SBUF/PSUM tensors using compute engines' (start_partition)",
    ),
    Rule(
        "view-dims",
        InvalidArgumentError,
        "an on-chip tensor view has at most 5 dims (the partition dim and 4 free dims); an iota pattern at "
        "most 4 [step, num] pairs",
        "GUIDE NkiTensor (a view: an access pattern of up to 5 dimensions); ISA iota (a pattern up to 4D)",
    ),
    Rule(
        "compute-on-chip",
        EngineMemoryError,
        "compute engines read and write SBUF/PSUM only; HBM data moves by DMA",
        "ARCH2 memory hierarchy",
        always=True,
    ),
    Rule(
        "tensor-engine-memories",
        EngineMemoryError,
        "the Tensor engine reads SBUF and writes PSUM (nc_matmul, Tensor-engine nc_transpose)",
        "ARCH2 Tensor Engine; ISA nc_matmul, nc_transpose",
        always=True,
    ),
    Rule(
        "psum-one-input",
        EngineMemoryError,
        "tensor_tensor / scalar_tensor_tensor: at most one of the two tensor inputs in PSUM",
        "ISA tensor_tensor, scalar_tensor_tensor",
        always=True,
    ),
    Rule(
        "tensor-copy-scalar-v2",
        InvalidArgumentError,
        "NeuronCore-v2 (trn1) has no Scalar-engine tensor_copy; use activation(op=nl.copy)",
        "ISA tensor_copy",
        always=True,
    ),
    Rule(
        "activation-bias-v2",
        InvalidArgumentError,
        "on NeuronCore-v2 (trn1) the activation bias is a [P,1] vector, not a scalar",
        "ISA activation (Layout)",
        always=True,
    ),
    Rule(
        "activation-reciprocal-bias-v2",
        InvalidArgumentError,
        "on NeuronCore-v2 (trn1) activation(op=nl.reciprocal) takes no bias",
        "SH nki-engine-sel (Reciprocal: 'doesn't support setting bias on NeuronCore-v2')",
    ),
    Rule(
        "matmul-fp8-e4m3fn",
        DtypeError,
        "nc_matmul takes float8_e4m3fn (OCP) inputs from NeuronCore-v4 (trn3) only, and never beside legacy "
        "float8_e4m3 in one matmul; trn1/trn2 take float8_e4m3 and float8_e5m2",
        "ISA nc_matmul (Data types); compiler error NCC_EVRF051 (F8E4M3FN not supported on TRN1/TRN2)",
    ),
    # ---- DMA -------------------------------------------------------------------------------------
    Rule(
        "dma-no-psum",
        EngineMemoryError,
        "DMA moves HBM and SBUF data; PSUM is evicted by a compute engine first",
        "ISA dma_copy (Memory types); MIG (DMA reads of PSUM removed)",
        always=True,
    ),
    Rule(
        "hwdge-target",
        InvalidArgumentError,
        "dge_mode=hwdge needs NeuronCore-v3+ (not trn1)",
        "ISA dma_copy, dma_transpose (dge_mode)",
        always=True,
    ),
    Rule(
        "hwdge-dtype",
        DtypeError,
        "a hwdge dma_copy copies raw bytes: src and dst dtypes are equal",
        "MIG 0.3.0 (hwdge dtype casts)",
        always=True,
    ),
    Rule(
        "dma-engine",
        InvalidArgumentError,
        "dma_copy engine= is only valid with dge_mode=hwdge, and then sync or scalar",
        "ISA dma_copy (engine); DGE hwdge",
        always=True,
    ),
    Rule(
        "dma-transpose-dge-mode",
        InvalidArgumentError,
        "a direct dma_transpose takes dge_mode unknown or hwdge",
        "ISA dma_transpose (DMA Direct Transpose Constraints)",
    ),
    Rule(
        "dma-transpose-2byte",
        DtypeError,
        "dma_transpose src dtype must be 2 bytes (both DGE lowerings say so; ARCH3 also mentions "
        "4-byte: the stricter reading applies to every mode)",
        "ISA dma_transpose; DGE hwdge/swdge transpose constraints",
    ),
    Rule(
        "dma-transpose-hwdge-shape",
        InvalidArgumentError,
        "hwdge dma_transpose: 2-D src.shape[0] == 16; 3-/4-D src.shape[0] in {1,2,4,8,16} and "
        "src.shape[0]*src.shape[-2] % 16 == 0; src.shape[-1] <= 128",
        "ISA dma_transpose; RN 0.6.0 (DmaTranspose relaxations)",
    ),
    # ---- logical cores ---------------------------------------------------------------------------
    Rule(
        "lnc-target",
        InvalidArgumentError,
        "LNC is 1 or 2 and applies only to Trn2/Trn3: trn1 launches one instance",
        "LNC",
    ),
    Rule(
        "core-barrier-lnc",
        InvalidArgumentError,
        "core_barrier needs NeuronCore-v3+ with LNC enabled (a 2-instance launch) and cores=(0, 1)",
        "ISA core_barrier",
    ),
    Rule(
        "sendrecv-lnc",
        InvalidArgumentError,
        "sendrecv / sendrecv_compute exchange between the two physical cores of an LNC=2 launch on "
        "NeuronCore-v3+ (a 2-instance launch on trn2/trn3); send_to_rank and recv_from_rank are 0 or 1",
        "ISA sendrecv, sendrecv_compute; nki.lnc module page",
    ),
    Rule(
        "sendrecv-memory",
        InvalidArgumentError,
        "sendrecv: src and dst both in SBUF; sendrecv_compute: both in SBUF or both in private HBM "
        "(never shared HBM, never mixed)",
        "ISA sendrecv, sendrecv_compute (Constraints)",
    ),
    Rule(
        "sendrecv-gpsimd-dma-size",
        InvalidArgumentError,
        "sendrecv with dma_engine=gpsimd_dma moves at most 1024 B per partition of 32-bit, 512 B of "
        "16-bit, 256 B of 8-bit data",
        "ISA sendrecv (dma_engine)",
    ),
    # ---- NKI 0.3.0 API forms (the 0.2.0 forms its compiler rejects) ------------------------------
    Rule(
        "memset-value-dtype",
        DtypeError,
        "memset into an integer tile takes an integer value (value=2, not 2.0)",
        "MIG 'nisa.memset — strict type matching'; RN 0.3.0",
    ),
    Rule(
        "enum-members",
        InvalidArgumentError,
        "enum parameters (engine, dge_mode, oob_mode, reduce_cmd) take enum members, not raw integers",
        "MIG 'Integer enum constants no longer supported'; RN 0.3.0",
        always=True,
    ),
    Rule(
        "buffer-objects",
        InvalidArgumentError,
        "buffer= takes a buffer object (nl.sbuf, nl.psum, nl.hbm, ...), not its name as a string",
        "MIG 'String buffer names no longer supported'; RN 0.3.0",
    ),
    # ---- language subset -------------------------------------------------------------------------
    Rule(
        "lang-no-generator",
        LanguageError,
        "kernel code (and helpers it calls) has no generators: no yield, yield from, next(), async",
        "GUIDE NKI Values / Control Flow (not listed); nki_simulator.rst Simulation Limitations",
    ),
    Rule(
        "lang-no-is",
        LanguageError,
        "no `is` / `is not` in kernel code; use == / !=",
        "MIG 'Replace is / is not with == / !='",
    ),
    Rule(
        "lang-no-kwonly",
        LanguageError,
        "a kernel signature has no keyword-only separator `*`: parameters with defaults go last",
        "MIG 'Remove keyword-only argument separator (*)'; RN 0.3.0",
    ),
    Rule(
        "lang-no-list-args",
        LanguageError,
        "kernel arguments are never lists (nested in tuples neither); pass tuples",
        "MIG 'Replace list kernel arguments with tuples'; RN 0.3.0",
    ),
)
RULES: dict[str, Rule] = {rule.name: rule for rule in RULE_LIST}
