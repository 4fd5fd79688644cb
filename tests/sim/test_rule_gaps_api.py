"""Kernels the second rules audit found passing wrongly: forms the NKI 0.3.0 compiler rejects (MIG 'NKI 0.3.0
Update Guide': API changes and language restrictions; RN 0.3.0 breaking changes) that the interpreter ran.
rules='error' throughout, as in the conformance tests."""

from __future__ import annotations

import warnings

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32, I32 = nl.float32, nl.int32


def memset_float_into_int():
    t = nl.ndarray((128, 8), dtype=I32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=2.0)  # <-gap-memset-float


def dma_with_raw_dge_mode(x):
    t = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x, dge_mode=2)  # <-gap-raw-dge-mode


def dma_with_raw_oob_mode(x):
    t = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x, oob_mode=0)  # <-gap-raw-oob-mode


def activation_with_raw_reduce_cmd(x):
    t = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    res = nl.ndarray((128, 1), dtype=F32, buffer=nl.sbuf)
    nisa.activation(  # <-gap-raw-reduce-cmd
        dst=t, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=res, reduce_cmd=3
    )


def string_buffer(x):
    t = nl.ndarray((128, 8), dtype=F32, buffer="sbuf")  # <-gap-string-buffer
    nisa.dma_copy(dst=t, src=x)


def keyword_only(x, *, scale=1.0):  # <-gap-kwonly
    t = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)


def takes_dims(x, dims):
    t = nl.ndarray((128, dims[1]), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)


X = torch.ones(128, 8)


@pytest.mark.parametrize(
    ("kernel", "error", "rule", "marker"),
    [
        (memset_float_into_int, sim.DtypeError, "[memset-value-dtype] value=2.0", "<-gap-memset-float"),
        (dma_with_raw_dge_mode, sim.InvalidArgumentError, "[enum-members] dge_mode=2", "<-gap-raw-dge-mode"),
        (dma_with_raw_oob_mode, sim.InvalidArgumentError, "[enum-members] oob_mode=0", "<-gap-raw-oob-mode"),
        (activation_with_raw_reduce_cmd, sim.InvalidArgumentError, "[enum-members] reduce_cmd=3",
         "<-gap-raw-reduce-cmd"),
        (string_buffer, sim.InvalidArgumentError, "[buffer-objects] buffer='sbuf'", "<-gap-string-buffer"),
        (keyword_only, sim.LanguageError, "[lang-no-kwonly] keyword-only parameter(s) scale", "<-gap-kwonly"),
    ],
)  # fmt: skip
def test_a_0_2_form_is_rejected_at_its_line(kernel, error, rule, marker):
    args = () if kernel is memset_float_into_int else (X,)
    with pytest.raises(error) as info:
        sim.run(kernel, *args, target="trn2", rules="error")
    assert rule in str(info.value)
    assert_located(info.value, __file__, marker)


def test_a_list_argument_is_rejected_at_the_launch_line():
    with pytest.raises(sim.LanguageError) as info:
        sim.run(takes_dims, X, [128, 8], rules="error")  # <-gap-list-arg
    assert "[lang-no-list-args] argument 'dims'" in str(info.value)
    assert_located(info.value, __file__, "<-gap-list-arg")
    with pytest.raises(sim.LanguageError, match=r"argument 'dims\[0\]'"):
        sim.run(takes_dims, X, dims=([128], 8), rules="error")


def test_warn_mode_runs_a_float_memset_into_ints():
    def kernel():
        t = nl.ndarray((128, 8), dtype=I32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=3.0)
        out = nl.ndarray((128, 8), dtype=I32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.warns(sim.ConformanceWarning, match=r"\[memset-value-dtype\]"):
        out = sim.run(kernel, rules="warn").outputs
    assert torch.equal(out, torch.full((128, 8), 3, dtype=torch.int32))


def test_the_0_3_forms_pass():
    """Integer memset values into integer tiles (and into float tiles), enum members, buffer objects, trailing
    parameters with defaults, tuple arguments."""

    def kernel(x, dims, scale=1.0):
        ints = nl.ndarray((128, 8), dtype=I32, buffer=nl.sbuf)
        nisa.memset(dst=ints, value=2)
        floats = nl.ndarray(dims, dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=floats, value=0)
        nisa.dma_copy(dst=floats, src=x, dge_mode=nisa.dge_mode.swdge, oob_mode=nisa.oob_mode.error)
        res = nl.ndarray((128, 1), dtype=F32, buffer=nl.sbuf)
        nisa.activation(dst=floats, op=nl.copy, data=floats, reduce_op=nl.add, reduce_res=res,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce, scale=scale)  # fmt: skip
        out = nl.ndarray((128, 1), dtype=F32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sim.run(kernel, X, (128, 8), rules="error").outputs
    assert torch.equal(out, X.sum(dim=1, keepdim=True))
