"""Every rule of fusegen/sim/rules.py has a kernel that breaks it: rules='error' raises the rule's error class
with the rule's name and this file's line; rules='warn' warns once and runs the instruction."""

from __future__ import annotations

import warnings

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32, BF16, I32 = nl.float32, nl.bfloat16, nl.int32


def _tile(shape, dtype=F32, buffer=nl.sbuf, value=1):
    t = nl.ndarray(shape, dtype=dtype, buffer=buffer)
    nisa.memset(dst=t, value=value)
    return t


def _dst(shape, dtype=F32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype=dtype, buffer=buffer)


def divide():
    a = _tile((128, 8))
    nisa.tensor_tensor(dst=_dst((128, 8)), data1=a, data2=a, op=nl.divide)  # <-alu-no-divide


def not_an_alu_op():
    nisa.tensor_scalar(dst=_dst((128, 8)), data=_tile((128, 8)), op0=nl.exp, operand0=0.0)  # <-alu-op-table


def maximum_on_gpsimd():
    a = _tile((128, 8))
    nisa.tensor_tensor(  # <-alu-engine
        dst=_dst((128, 8)), data1=a, data2=a, op=nl.maximum, engine=nisa.engine.gpsimd
    )


def multiply_on_gpsimd():
    a = _tile((128, 8))
    nisa.tensor_scalar(  # <-tensor-scalar-gpsimd
        dst=_dst((128, 8)), data=a, op0=nl.multiply, operand0=2.0, engine=nisa.engine.gpsimd
    )


def subtract_on_scalar():
    a = _tile((128, 8))
    nisa.tensor_scalar(  # <-scalar-engine-pairs
        dst=_dst((128, 8)), data=a, op0=nl.subtract, operand0=1.0, engine=nisa.engine.scalar
    )


def mixed_kinds():
    a = _tile((128, 8), I32)
    nisa.tensor_scalar(  # <-tensor-scalar-op-kinds
        dst=_dst((128, 8), I32), data=a, op0=nl.bitwise_and, operand0=3, op1=nl.add, operand1=1
    )


def unary_with_operand():
    nisa.tensor_scalar(  # <-tensor-scalar-unary-operand
        dst=_dst((128, 8)), data=_tile((128, 8)), op0=nl.abs, operand0=2.0
    )


def bf16_operand():
    col = _tile((128, 1), BF16)
    nisa.tensor_scalar(  # <-tensor-scalar-operand-fp32
        dst=_dst((128, 8)), data=_tile((128, 8)), op0=nl.add, operand0=col
    )


def stt_bitvec():
    a = _tile((128, 8), I32)
    nisa.scalar_tensor_tensor(  # <-stt-arithmetic-only
        dst=_dst((128, 8), I32), data=a, op0=nl.bitwise_and, operand0=1, op1=nl.add, operand1=a
    )


def bitvec_on_floats():
    a = _tile((128, 8))
    nisa.tensor_tensor(dst=_dst((128, 8)), data1=a, data2=a, op=nl.bitwise_and)  # <-bitvec-integer


def abs_max_reduction():
    nisa.tensor_reduce(  # <-reduce-op-legal
        dst=_dst((128, 1)), op=nl.abs_max, data=_tile((128, 8)), axis=(1,)
    )


def cos_activation():
    nisa.activation(dst=_dst((128, 8)), op=nl.cos, data=_tile((128, 8)))  # <-activation-table


def bf16_scale():
    scale = _tile((128, 1), BF16)
    nisa.activation(  # <-activation-scale-fp32
        dst=_dst((128, 8)), op=nl.exp, data=_tile((128, 8)), scale=scale
    )


def max_reduce_activation():
    nisa.activation_reduce(  # <-activation-reduce-add
        dst=_dst((128, 8)), op=nl.copy, data=_tile((128, 8)), reduce_op=nl.maximum, reduce_res=_dst((128, 1))
    )


def power_reads_psum():
    ps = _tile((128, 8), buffer=nl.psum)
    nisa.tensor_tensor(dst=_dst((128, 8)), data1=ps, data2=_tile((128, 8)), op=nl.power)  # <-gpsimd-no-psum


def wide_vector_copy(x):
    src = _dst((1, 65537), BF16)
    nisa.dma_copy(dst=src, src=x)  # DMA has no free-size limit
    nisa.tensor_copy(dst=_dst((1, 65537), BF16), src=src)  # <-engine-free-size


def six_dim_view(x):
    t = _dst((128, 2, 2, 2, 2, 2))  # allocating is fine: an instruction's operand is a view
    nisa.dma_copy(dst=t.reshape((128, 32)), src=x)  # DMA views of 2 dims
    nisa.tensor_copy(dst=_dst((128, 32)), src=t)  # <-view-dims


def five_dim_iota():
    nisa.iota(dst=_dst((128, 32), I32), pattern=[[1, 2], [2, 2], [4, 2], [8, 2], [16, 2]])  # <-iota-view-dims


def misaligned_partitions():
    t = _tile((128, 8))
    nisa.tensor_copy(dst=t[33:66, :], src=t[0:33, :])  # <-start-partition


def transpose(dtype=BF16, shape=(32, 16), dge=None):
    def kernel():
        src = _tile(shape, dtype)
        dst = _dst(shape[::-1], dtype)
        nisa.dma_transpose(dst=dst, src=src, dge_mode=dge or nisa.dge_mode.unknown)  # <-dma-transpose

    return kernel


def barrier_without_lnc(x):
    nisa.core_barrier(data=x, cores=(0, 1))  # <-core-barrier-lnc


def sendrecv_on_one_core():
    t = _tile((128, 8))
    nisa.sendrecv(src=t, dst=_dst((128, 8)), send_to_rank=0, recv_from_rank=0, pipe_id=0)  # <-sendrecv-lnc


def sendrecv_compute_from_hbm(x):
    nisa.sendrecv_compute(src=x, dst=_dst((2, 2)), send_to_rank=1, recv_from_rank=1,  # <-sendrecv-memory
                          reduce_op=nl.add)


def gpsimd_dma_too_big():
    t = _tile((128, 512), BF16)
    nisa.sendrecv(src=t, dst=_dst((128, 512), BF16), send_to_rank=1, recv_from_rank=1,  # <-sendrecv-gpsimd
                  pipe_id=0, dma_engine=nisa.dma_engine.gpsimd_dma)


def nested_generator():
    def steps():
        nisa.memset(dst=_dst((128, 8)), value=0.0)
        yield  # <-lang-no-generator

    for _ in steps():
        pass


def _helper_with_generator():
    """A same-module helper the kernel calls: checked too."""
    yield from range(2)  # <-lang-helper-generator


def calls_generator_helper():
    for _ in _helper_with_generator():
        pass


def steps_an_iterator():
    parts = iter([1, 2])
    next(parts)  # <-lang-next


def identity_test(x):
    if x is None:  # <-lang-no-is
        return None
    return None


def activation_reads_hbm(x):
    nisa.activation(dst=_dst((2, 2)), op=nl.exp, data=x)  # <-compute-on-chip


def matmul_into_sbuf():
    a = _tile((128, 64))
    nisa.nc_matmul(dst=_dst((64, 64)), stationary=a, moving=a)  # <-tensor-engine-memories


def ocp_fp8_matmul_on_trn2():
    w, x = _tile((128, 64), nl.float8_e4m3fn), _tile((128, 64), BF16)
    nisa.nc_matmul(dst=_dst((64, 64), buffer=nl.psum), stationary=w, moving=x)  # <-matmul-fp8-e4m3fn


def reciprocal_with_bias():
    data, bias = _tile((128, 8)), _tile((128, 1))
    nisa.activation(dst=_dst((128, 8)), op=nl.reciprocal, data=data, bias=bias)  # <-reciprocal-bias


def both_inputs_in_psum():
    ps = _tile((128, 8), buffer=nl.psum)
    nisa.tensor_tensor(dst=_dst((128, 8)), data1=ps, data2=ps, op=nl.add)  # <-psum-one-input


def scalar_engine_copy():
    src = _tile((128, 8))
    nisa.tensor_copy(dst=_dst((128, 8)), src=src, engine=nisa.engine.scalar)  # <-tensor-copy-scalar-v2


def scalar_bias():
    nisa.activation(dst=_dst((128, 8)), op=nl.exp, data=_tile((128, 8)), bias=1.0)  # <-activation-bias-v2


def dma_from_psum(x):
    nisa.dma_copy(dst=x, src=_tile((2, 2), buffer=nl.psum))  # <-dma-no-psum


def dma(dge, engine=None, dtype=F32):
    def kernel(x):
        mode = engine or nisa.engine.unknown
        nisa.dma_copy(dst=_dst((2, 2), dtype), src=x, dge_mode=dge, engine=mode)  # <-dma-mode

    return kernel


def sine_past_pi():
    nisa.activation(dst=_dst((128, 8)), op=nl.sin, data=_tile((128, 8), value=4))  # <-activation-input-range


def float_memset_into_ints():
    nisa.memset(dst=_dst((128, 8), I32), value=2.0)  # <-memset-value-dtype


def raw_dge_mode(x):
    nisa.dma_copy(dst=_dst((2, 2)), src=x, dge_mode=2)  # <-enum-members


def string_buffer():
    nl.ndarray((2, 2), dtype=F32, buffer="sbuf")  # <-buffer-objects


def keyword_only(x, *, scale=1.0):  # <-lang-no-kwonly
    return None


# rule -> (kernel, marker, target, args)
CASES = {
    "alu-no-divide": (divide, "<-alu-no-divide", "trn2", ()),
    "alu-op-table": (not_an_alu_op, "<-alu-op-table", "trn2", ()),
    "alu-engine": (maximum_on_gpsimd, "<-alu-engine", "trn2", ()),
    "tensor-scalar-gpsimd": (multiply_on_gpsimd, "<-tensor-scalar-gpsimd", "trn2", ()),
    "scalar-engine-pairs": (subtract_on_scalar, "<-scalar-engine-pairs", "trn2", ()),
    "tensor-scalar-op-kinds": (mixed_kinds, "<-tensor-scalar-op-kinds", "trn2", ()),
    "tensor-scalar-unary-operand": (unary_with_operand, "<-tensor-scalar-unary-operand", "trn2", ()),
    "tensor-scalar-operand-fp32": (bf16_operand, "<-tensor-scalar-operand-fp32", "trn2", ()),
    "stt-arithmetic-only": (stt_bitvec, "<-stt-arithmetic-only", "trn2", ()),
    "bitvec-integer": (bitvec_on_floats, "<-bitvec-integer", "trn2", ()),
    "reduce-op-legal": (abs_max_reduction, "<-reduce-op-legal", "trn2", ()),
    "activation-table": (cos_activation, "<-activation-table", "trn2", ()),
    "activation-scale-fp32": (bf16_scale, "<-activation-scale-fp32", "trn2", ()),
    "activation-reduce-add": (max_reduce_activation, "<-activation-reduce-add", "trn1", ()),
    "gpsimd-no-psum": (power_reads_psum, "<-gpsimd-no-psum", "trn2", ()),
    "engine-free-size": (wide_vector_copy, "<-engine-free-size", "trn2", (torch.zeros(1, 65537).bfloat16(),)),
    "start-partition": (misaligned_partitions, "<-start-partition", "trn2", ()),
    "view-dims": (six_dim_view, "<-view-dims", "trn2", (torch.ones(128, 32),)),
    "dma-transpose-dge-mode": (transpose(dge=nisa.dge_mode.swdge), "<-dma-transpose", "trn2", ()),
    "dma-transpose-2byte": (transpose(F32), "<-dma-transpose", "trn2", ()),
    "dma-transpose-hwdge-shape": (transpose(dge=nisa.dge_mode.hwdge), "<-dma-transpose", "trn2", ()),
    "core-barrier-lnc": (barrier_without_lnc, "<-core-barrier-lnc", "trn2", (torch.zeros(2, 2),)),
    "sendrecv-lnc": (sendrecv_on_one_core, "<-sendrecv-lnc", "trn2", ()),
    "sendrecv-memory": (sendrecv_compute_from_hbm, "<-sendrecv-memory", "trn2", (torch.zeros(2, 2),)),
    "sendrecv-gpsimd-dma-size": (gpsimd_dma_too_big, "<-sendrecv-gpsimd", "trn2", ()),
    "compute-on-chip": (activation_reads_hbm, "<-compute-on-chip", "trn2", (torch.ones(2, 2),)),
    "tensor-engine-memories": (matmul_into_sbuf, "<-tensor-engine-memories", "trn2", ()),
    "matmul-fp8-e4m3fn": (ocp_fp8_matmul_on_trn2, "<-matmul-fp8-e4m3fn", "trn2", ()),
    "activation-reciprocal-bias-v2": (reciprocal_with_bias, "<-reciprocal-bias", "trn1", ()),
    "psum-one-input": (both_inputs_in_psum, "<-psum-one-input", "trn2", ()),
    "tensor-copy-scalar-v2": (scalar_engine_copy, "<-tensor-copy-scalar-v2", "trn1", ()),
    "activation-bias-v2": (scalar_bias, "<-activation-bias-v2", "trn1", ()),
    "dma-no-psum": (dma_from_psum, "<-dma-no-psum", "trn2", (torch.ones(2, 2),)),
    "hwdge-target": (dma(nisa.dge_mode.hwdge), "<-dma-mode", "trn1", (torch.ones(2, 2),)),
    "hwdge-dtype": (dma(nisa.dge_mode.hwdge, dtype=BF16), "<-dma-mode", "trn2", (torch.ones(2, 2),)),
    "dma-engine": (dma(nisa.dge_mode.swdge, nisa.engine.scalar), "<-dma-mode", "trn2", (torch.ones(2, 2),)),
    "lang-no-generator": (nested_generator, "<-lang-no-generator", "trn2", ()),
    "lang-no-is": (identity_test, "<-lang-no-is", "trn2", (None,)),
    "activation-input-range": (sine_past_pi, "<-activation-input-range", "trn2", ()),
    "memset-value-dtype": (float_memset_into_ints, "<-memset-value-dtype", "trn2", ()),
    "enum-members": (raw_dge_mode, "<-enum-members", "trn2", (torch.ones(2, 2),)),
    "buffer-objects": (string_buffer, "<-buffer-objects", "trn2", ()),
    "lang-no-kwonly": (keyword_only, "<-lang-no-kwonly", "trn2", (None,)),
}


def test_every_rule_has_a_breaking_kernel():
    # reported at the launching line: test_rules.py's lnc-target test, test_rule_gaps_api.py's list test
    assert set(CASES) | {"lnc-target", "lang-no-list-args"} == set(sim.RULES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_breaking_kernel_raises_the_rule(name):
    kernel, marker, target, args = CASES[name]
    rule = sim.RULES[name]
    with pytest.raises(rule.error) as info:
        sim.run(kernel, *args, target=target, rules="error")
    assert f"[{name}]" in str(info.value) and rule.source in str(info.value)
    assert_located(info.value, __file__, marker)


@pytest.mark.parametrize(
    ("kernel", "marker"),
    [(calls_generator_helper, "<-lang-helper-generator"), (steps_an_iterator, "<-lang-next")],
)
def test_generators_in_helpers_and_next_are_rejected(kernel, marker):
    with pytest.raises(sim.LanguageError, match=r"\[lang-no-generator\]") as info:
        sim.run(kernel, rules="error")
    assert_located(info.value, __file__, marker)


def test_lnc2_on_trn1_is_rejected_at_the_launch_line():
    with sim.installed(target="trn1", rules="error"):
        import nki

        kernel = nki.jit(lambda: None)
    with pytest.raises(sim.InvalidArgumentError, match=r"\[lnc-target\]") as info:
        kernel[2]()  # <-lnc-target
    assert_located(info.value, __file__, "<-lnc-target")
    kernel[1]()


def test_lnc_target_in_warn_mode_warns_once_per_launching_line():
    with sim.installed(target="trn1", rules="warn"):
        import nki

        kernel = nki.jit(lambda: None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                kernel[2]()
    assert [str(w.message).count("[lnc-target]") for w in caught] == [1]


def test_warn_mode_warns_once_per_line_and_runs_the_instruction():
    def kernel(x):
        a = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        out = nl.ndarray((128, 8), dtype=F32, buffer=nl.shared_hbm)
        for _ in range(3):
            nisa.tensor_tensor(dst=a, data1=a, data2=a, op=nl.divide)
        nisa.dma_copy(dst=out, src=a)
        return out

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sim.run(kernel, torch.full((128, 8), 3.0), rules="warn").outputs
    assert torch.equal(out, torch.ones(128, 8))
    assert [str(w.message).count("[alu-no-divide]") for w in caught] == [1]


def test_always_rules_raise_in_warn_mode_too():
    with pytest.raises(sim.EngineMemoryError, match=r"\[gpsimd-no-psum\]"):
        sim.run(power_reads_psum, rules="warn")


def test_seed_style_transposes_and_legal_engines_pass():
    """Legal counterparts of the breaking kernels run clean under rules='error'."""

    def kernel():
        a = _tile((128, 8))
        nisa.tensor_tensor(dst=_dst((128, 8)), data1=a, data2=a, op=nl.add, engine=nisa.engine.gpsimd)
        nisa.tensor_scalar(dst=_dst((128, 8)), data=a, op0=nl.rsqrt, operand0=None, engine=nisa.engine.gpsimd)
        nisa.tensor_scalar(
            dst=_dst((128, 8)),
            data=a,
            op0=nl.multiply,
            operand0=2.0,
            op1=nl.add,
            operand1=1.0,
            engine=nisa.engine.scalar,
        )
        t = _tile((128, 8))
        nisa.tensor_copy(dst=t[64:96, :], src=t[0:32, :])
        nisa.tensor_copy(dst=t[64:128, :], src=t[0:64, :])
        transpose(shape=(16, 128), dge=nisa.dge_mode.hwdge)()
        transpose(shape=(128, 96))()
        nisa.tensor_copy(dst=_dst((128, 2, 2, 2, 2)), src=_tile((128, 2, 2, 2, 2)))  # 5-D views
        nisa.iota(dst=_dst((128, 16), I32), pattern=[[1, 2], [2, 2], [4, 2], [8, 2]])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.run(kernel, rules="error")


def test_an_iota_pattern_past_4d_breaks_view_dims():
    with pytest.raises(sim.InvalidArgumentError, match=r"\[view-dims\] pattern has 5") as info:
        sim.run(five_dim_iota, rules="error")
    assert_located(info.value, __file__, "<-iota-view-dims")


def test_docs_list_every_rule_with_its_source():
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "sim.md").read_text()
    for rule in sim.RULES.values():
        assert f"| `{rule.name}`" in docs and rule.source in docs, rule.name
