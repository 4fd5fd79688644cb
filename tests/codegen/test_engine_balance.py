"""Scalar/Vector balance of row kernels: per-row affine steps move to the Scalar engine when it is idler."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fusegen.codegen.select_tables import CLOCK_GHZ, EngineLoad
from fusegen.sim import load_module

GENERATED = Path(__file__).resolve().parents[2] / "generated"


def _body(name: str, function: str) -> str:
    """The source of `function` in generated/<name>/kernel.py."""
    text = (GENERATED / name / "kernel.py").read_text()
    start = text.index(f"def {function}(")
    end = text.index("\ndef ", start + 1)
    return text[start:end]


def _full_width(call: str, body: str) -> list[str]:
    """The `nisa.<call>` lines of `body` whose destination is not a [P, 1] column."""
    column = re.compile(r"dst=\w+\[0:pt, 0:1\]")
    return [ln for ln in body.splitlines() if f"nisa.{call}(" in ln and not column.search(ln)]


def test_counting_lowering_never_moves_and_a_planned_one_moves_only_while_the_max_drops() -> None:
    assert not EngineLoad().prefers_scalar(1)
    vector_heavy = EngineLoad(planned={"act": 0.0, "dve": 3 / CLOCK_GHZ["dve"]})
    assert vector_heavy.prefers_scalar(1)  # max(0.83, 2.08) < 3.125
    assert vector_heavy.prefers_scalar(1)  # max(1.67, 1.04) < 2.08
    assert not vector_heavy.prefers_scalar(1)  # max(2.5, 0) > 1.67: stays on Vector
    assert not EngineLoad(planned={"act": 2.0, "dve": 1.0}).prefers_scalar(1)


def test_layernorm_centres_on_the_scalar_engine() -> None:
    passes, epilogue = _body("layernorm", "_head_passes"), _body("layernorm", "_head_epilogue")
    # sum((x - mean)^2): one activation_reduce with the mean as a (negated) bias, no Vector subtract
    assert re.search(r"activation_reduce\(.*op=nl.square, data=x_ld.*bias=", passes)
    assert not _full_width("tensor_scalar", passes + epilogue)
    assert re.search(r"nisa.activation\(.*op=nl.copy, data=x_ld\[0:pt, 0:d_H\], bias=", epilogue)


def test_softmax_exponent_takes_scale_and_max_as_activation_arguments() -> None:
    epilogue = _body("scaled_softmax", "_head_epilogue")
    assert re.search(r"op=nl.exp, data=x_ld\[0:pt, 0:d_H\], bias=\w+\[0:pt, 0:1\], scale=scale_arg", epilogue)


def test_softmax_normalises_inside_the_exponent_and_takes_the_max_of_the_loaded_row() -> None:
    passes, epilogue = _body("scaled_softmax", "_head_passes"), _body("scaled_softmax", "_head_epilogue")
    # p = exp(x*s - (max + log sum)): one Scalar pass, no reciprocal scaling on Vector
    assert not _full_width("tensor_scalar", epilogue) and "reciprocal" not in epilogue
    assert re.search(r"nisa.activation\(dst=\w+\[0:pt, 0:d_H\], op=nl.exp, data=x_ld", epilogue)
    # max(x*s) = s * (max or min of x): the bf16 row reduced as loaded, no scaled fp32 copy of it
    extreme = r"op=\(nl.maximum if scale_arg >= 0 else nl.minimum\), data=x_ld"
    assert re.search(r"tensor_reduce\(.*" + extreme, passes)
    assert not _full_width("tensor_scalar", passes) and not _full_width("activation(", passes)


@pytest.mark.parametrize("scale", [0.37, -8.0, 0.0])
def test_softmax_folds_hold_for_any_sign_of_the_scale(scale: float) -> None:
    """The max of s*x is s*min(x) for s < 0 (s = -8 spreads z over ~256, so shifting by anything but the
    true max overflows exp in fp32); the exponent's folded log keeps p and lse exact to rounding."""
    gen = torch.Generator().manual_seed(3)
    x = (4 * torch.randn(130, 640, generator=gen)).bfloat16()  # two token tiles, the second partial
    module = load_module(GENERATED / "scaled_softmax" / "kernel.py", target="trn2")
    p, lse = module.scaled_softmax(x, scale=scale, lnc=1)
    z = x.double() * scale
    want_p, want_lse = torch.softmax(z, dim=-1), torch.logsumexp(z, dim=-1, keepdim=True)
    assert (p.double() - want_p).abs().max().item() <= 2e-2 * want_p.abs().max().item()
    assert torch.allclose(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


def test_add_of_two_rows_runs_on_the_tensor_engine_and_a_product_reads_a_staged_row() -> None:
    passes, epilogue = _body("add_rmsnorm", "_head_passes"), _body("add_rmsnorm", "_head_epilogue")
    for body in (passes, epilogue):  # x + r: I @ x, then I @ r accumulated, into PSUM
        assert re.search(r"nc_matmul\(.*stationary=pe_identity.*moving=x_ld.*accumulate=False", body)
        assert re.search(r"nc_matmul\(.*stationary=pe_identity.*moving=r_ld.*accumulate=True", body)
        # the Vector add is only the fallback for rows wider than the PSUM banks
        vector_add = [ln for ln in _full_width("tensor_tensor", body) if "op=nl.add" in ln]
        assert len(vector_add) == 1 and body.index(vector_add[0]) > body.index("else:")
    engram = _body("engram_gate", "_row_passes")  # the reduction passes both passes helpers call
    # x * k reads x staged in PSUM and overwrites it there, so `* w` reads PSUM as well (N cycles each)
    staged = re.search(r"nc_matmul\(dst=(\w+)\[.*moving=x_ld", engram)
    assert staged is not None
    tile = staged.group(1)
    assert f"tensor_tensor(dst={tile}[0:pt, 0:hw], data1={tile}[0:pt, 0:hw], data2=k_ld" in engram
    weighted = rf"tensor_tensor\(dst=\w+\[0:pt, 0:hw\], data1={tile}\[0:pt, 0:hw\], data2=prepared"
    assert re.search(weighted, engram)


def test_add_rmsnorm_wider_than_the_psum_banks_takes_the_sbuf_form() -> None:
    """H = 4224 > 4096 fp32 columns: the epilogue's x + r is the Vector add; results as torch has them."""
    gen = torch.Generator().manual_seed(5)
    t, h = 3, 4224
    x, r = (torch.randn(t, h, generator=gen).bfloat16() for _ in range(2))
    w = (1 + 0.1 * torch.randn(h, generator=gen)).bfloat16()
    module = load_module(GENERATED / "add_rmsnorm" / "kernel.py", target="trn2")
    y, s = module.add_rmsnorm(x, r, w, lnc=1)
    want_s = x.float() + r.float()
    want_y = torch.nn.functional.rms_norm(want_s, (h,), w.float(), 1e-6)
    assert torch.equal(s, want_s.bfloat16())
    assert (y.float() - want_y).abs().max().item() <= 2e-2 * want_y.abs().max().item()


def test_layernorm_scales_inside_its_centring_activation_which_writes_psum() -> None:
    epilogue = _body("layernorm", "_head_epilogue")
    # (x - mean) * rstd: one activation with scale rstd and bias -mean*rstd, into a PSUM tile
    column = r"\w+\[0:pt, 0:1\]"
    centred = re.search(rf"nisa.activation\(dst=(\w+)\[.*op=nl.copy, data=x_ld\[0:pt, 0:d_H\], "
                        rf"bias={column}, scale={column}\)", epilogue)  # fmt: skip
    assert centred is not None
    tile = centred.group(1)
    assert re.search(rf"{tile} = nl.ndarray\(.*buffer=nl.psum if d_H <=", epilogue)
    # * w and + b read it in PSUM (N cycles each), no scalar_tensor_tensor (2N)
    assert f"tensor_tensor(dst={tile}[0:pt, 0:d_H], data1={tile}[0:pt, 0:d_H], data2=prepared[0]" in epilogue
    assert "scalar_tensor_tensor" not in epilogue


def test_layernorm_wider_than_the_psum_banks_takes_the_sbuf_form() -> None:
    """H = 4224 > 4096 fp32 columns: the folded activation writes SBUF; results as torch has them."""
    gen = torch.Generator().manual_seed(6)
    t, h = 3, 4224
    x = (3 + torch.randn(t, h, generator=gen)).bfloat16()  # a mean well away from 0
    w, b = 1 + 0.1 * torch.randn(h, generator=gen), 0.1 * torch.randn(h, generator=gen)
    module = load_module(GENERATED / "layernorm" / "kernel.py", target="trn2")
    y, mu, rstd = module.layernorm(x, w, b, save=True, lnc=1)
    want = torch.nn.functional.layer_norm(x.float(), (h,), w, b, 1e-5)
    assert (y.float() - want).abs().max().item() <= 2e-2 * want.abs().max().item()
    assert torch.allclose(mu, x.float().mean(-1), rtol=1e-5, atol=1e-6)
    assert torch.allclose(rstd, torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5), rtol=1e-5)
