"""The FFN backward's weight-gradient GEMM (ffn/token_gemm.py) on the interpreter against torch formulas."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.codegen.ffn.token_gemm import token_gemm_source
from fusegen.sim import load_module
from tests.codegen.test_autodiff import calc_diff


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> object:
    path = Path(tmp_path_factory.mktemp("token_gemm")) / "token_gemm.py"
    path.write_text(token_gemm_source(), encoding="utf-8")
    return load_module(path)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize(("r", "m", "n"), [(7, 128, 200), (300, 200, 640), (1, 5, 3)])
def test_token_gemm_is_x_transpose_dy_and_column_sums(kernels: object, r: int, m: int, n: int,
                                                       lnc: int) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(r + m)
    x, dy = torch.randn(r, m, generator=gen).bfloat16(), torch.randn(r, n, generator=gen)
    dy = dy if lnc == 2 else dy.bfloat16()  # f32 dy: x's tiles widened (fp32 pairs only with fp32)
    dw, db = kernels._token_gemm(x, dy, lnc=lnc)  # type: ignore[attr-defined]
    want_dw = torch.einsum("rm,rn->mn", x.double(), dy.double())  # fp64: the sum over tokens of x ⊗ dy
    want_db = dy.double().sum(0)
    assert dw.shape == (m, n) and db.shape == (n,) and dw.dtype == db.dtype == torch.float32
    assert calc_diff(dw, want_dw) <= 1e-12 and calc_diff(db, want_db) <= 1e-12


@pytest.mark.parametrize(("a_dtype", "transposed"), [(torch.bfloat16, False), (torch.float32, True)])
@pytest.mark.parametrize(("r", "c", "n"), [(7, 128, 200), (130, 200, 600)])
def test_row_gemm_is_a_at_b(kernels: object, r: int, c: int, n: int, a_dtype: torch.dtype,
                            transposed: bool) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(r + c)
    a = torch.randn(r, c, generator=gen).to(a_dtype)
    b = torch.randn(*((n, c) if transposed else (c, n)), generator=gen).bfloat16()
    got = kernels._row_gemm(a, b, transposed=transposed, lnc=2)  # type: ignore[attr-defined]
    want = a.double() @ (b.double().T if transposed else b.double())
    assert got.shape == (r, n) and got.dtype == torch.float32
    assert calc_diff(got, want) <= 1e-12
