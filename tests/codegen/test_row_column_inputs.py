"""Row kernels take per-row column inputs (`s: f32[T]` read as `s[:, None]`, `s: f32[T, G]` as
`s[:, :, None]`: a router weight, a per-token dequant scale) in the forward kernel, staged once per token
tile into a [P, G] tile; training runs through the generated backward (the backward kernel where the family
carries it, which writes the column input's [T, G] gradient, else the torch backward). Forward outputs and
gradients through torch.ops.fusegen.<name> against hand-written torch formulas at T=130 (a ragged second
token tile), G=3, H=384, the column input a strided view; every kernel under rules='error', at each overlap
level and streamed, with the interpreter's SBUF peak within the plan's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fusegen.cli import main
from fusegen.codegen.family import Mismatch
from fusegen.codegen.files.ops import load_ops
from fusegen.codegen.rowreduce.family import ROWREDUCE
from fusegen.conformance import away_from_zero
from fusegen.dsl.check import load_spec
from fusegen.sim import load_module
from fusegen.testing import load_generated

T, G, H = 130, 3, 384
EPS = 1e-6
HEAD = "dim T, G, H\nrequire H % 128 == 0\ninput x: bf16[T, G, H]\n"
FLAT = "dim T, H\ninput x: bf16[T, H]\n"
#: name -> (spec body after `kernel <name>`, whether a backward kernel trains it)
SPECS = {
    "colin_gate2": (FLAT + "input s: f32[T]\noutput y: bf16[T, H]\ny = bf16(rmsnorm(x, 1e-6) * s[:, None])\n"
                    "check T=3 H=128\n", False),
    "colin_gate3": (HEAD + "input s: f32[T, G]\noutput y: bf16[T, G, H]\n"
                    "y = bf16(rmsnorm(x, 1e-6) * s[:, :, None])\ncheck T=3 G=2 H=128\n", True),
    "colin_bf16col": (HEAD + "input s: bf16[T, G]\noutput y: bf16[T, G, H]\n"
                      "y = bf16(rmsnorm(x, 1e-6) * s[:, :, None])\ncheck T=3 G=2 H=128\n", True),
    "colin_stat2": (FLAT + "input s: f32[T]\ninput w: bf16[H]\noutput y: bf16[T, H]\n"
                    "y = rmsnorm(x + s[:, None], 1e-6, w)\ncheck T=3 H=128\n", False),
    "colin_stat3": (HEAD + "input s: f32[T, G]\ninput w: bf16[G, H]\noutput y: bf16[T, G, H]\n"
                    "y = bf16(rmsnorm(x + s[:, :, None], 1e-6) * w)\ncheck T=3 G=2 H=128\n", True),
}  # fmt: skip


def _rms(u: torch.Tensor) -> torch.Tensor:
    return u * torch.rsqrt(u.square().mean(-1, keepdim=True) + EPS)


#: the math of each spec in float64, written independently of the spec (x, s, then w where there is one)
FORMULAS: dict[str, Callable[..., torch.Tensor]] = {
    "colin_gate2": lambda x, s: _rms(x) * s[:, None],
    "colin_gate3": lambda x, s: _rms(x) * s[:, :, None],
    "colin_bf16col": lambda x, s: _rms(x) * s[:, :, None],
    "colin_stat2": lambda x, s, w: _rms(x + s[:, None]) * w,
    "colin_stat3": lambda x, s, w: _rms(x + s[:, :, None]) * w,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("column_inputs")
    paths = []
    for name, (body, _) in SPECS.items():
        paths.append(out / f"{name}.spec")
        paths[-1].write_text(f"kernel {name}\n{body}")
    assert main(["build", "--out", str(out / "gen"), *map(str, paths)]) == 0
    return out / "gen"


def _leaves(name: str) -> tuple[torch.Tensor, ...]:
    """Leaf tensors the inputs are views of: x inside a wider row, s a strided column of a wider tensor."""
    flat = name.endswith("2")
    gen = torch.Generator().manual_seed(5)
    rows = (T,) if flat else (T, G)
    x = torch.randn((*rows, H + 128), generator=gen).bfloat16()
    dtype = torch.bfloat16 if "bf16" in name else torch.float32
    s = (0.5 + torch.rand((T, 4) if flat else (T, 2 * G), generator=gen)).to(dtype)
    w = (1 + 0.1 * torch.randn((*rows[1:], H), generator=gen)).bfloat16()
    return (x, s, w) if "stat" in name else (x, s)


def _views(name: str, leaves: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    x, s = leaves[0][..., :H], leaves[1][:, 1] if name.endswith("2") else leaves[1][:, ::2]
    assert not x.is_contiguous() and not s.is_contiguous()
    return (x, s, *leaves[2:])


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within bf16 rounding of the largest value: outputs and gradients pass through bf16 on the way."""
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=2**-7 * want.abs().max().item())


@pytest.mark.parametrize("name", list(SPECS))
def test_forward_and_gradients_match_the_formula(built: Path, name: str) -> None:
    """The op's output and the gradients of every input, the column's landing in its strided slice only."""
    assert ("backward_kernel.py" in (built / name / "ops.py").read_text()) == SPECS[name][1]
    load_ops(built / name)
    op = getattr(torch.ops.fusegen, name)
    leaves = tuple(t.clone().requires_grad_(True) for t in _leaves(name))
    y = op(*_views(name, leaves))
    exact = tuple(t.detach().double().requires_grad_(True) for t in leaves)
    want = FORMULAS[name](*_views(name, exact))
    _close(y, want.detach())
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(6)).bfloat16()
    (y.double() * cot.double()).sum().backward()
    (want * cot.double()).sum().backward()
    for got_leaf, want_leaf in zip(leaves, exact, strict=True):
        assert got_leaf.grad is not None and want_leaf.grad is not None
        _close(got_leaf.grad, want_leaf.grad)
    s_grad = leaves[1].grad
    assert s_grad is not None and s_grad.abs().sum() > 0
    untouched = s_grad[:, 0] if name.endswith("2") else s_grad[:, 1::2]
    assert torch.equal(untouched, torch.zeros_like(untouched))  # the columns beside the view's


def _kernel(built: Path, name: str, file: str, target: str) -> ModuleType:
    return load_module(built / name / file, target=target, rules="error")


@pytest.mark.parametrize("name", list(SPECS))
def test_every_schedule_conforms_and_gives_the_same_bits(built: Path, name: str) -> None:
    """The forward kernel under rules='error' at each overlap level (the per-tile chain, overlapped heads,
    serial: the same bits) and with rows streamed in 128-column chunks, all the formula's values, the
    interpreter's SBUF peak within the plan's each time (the column inputs' [P, G] tiles counted)."""
    module = _kernel(built, name, "kernel.py", "trn2")
    kernel = getattr(module, f"{name}_kernel")
    args = tuple(t.contiguous() for t in _views(name, _leaves(name)))
    heads = 1 if name.endswith("2") else G
    hb, resident, _, _ = module._choose_rows(module._MODEL, H, heads, module._SBUF_BUDGET["trn2"])
    runs = []
    for level, streamed, chunk in ((module._TILE, False, hb), (module._HEADS, False, hb),
                                   (module._SERIAL, False, hb), (module._SERIAL, True, 128)):  # fmt: skip
        runs.append(kernel[1](*args, chunk, resident, level, streamed, False))
        peak = max(c["sbuf_peak_bytes"] for c in kernel.last_run.stats["cores"])
        model = module._MODEL
        assert 0 < peak <= module._sbuf_bytes(model, H, heads, chunk, resident, level, streamed), level
    for run in runs[1:3]:  # the streamed run sums its statistics in other chunks: other roundings
        assert torch.equal(run, runs[0])
    for run in (runs[0], runs[3]):
        _close(run, FORMULAS[name](*(t.double() for t in args)))


@pytest.mark.parametrize("name", [n for n, (_, kernel) in SPECS.items() if kernel])
@pytest.mark.parametrize("target", ["trn2", "trn1"])
def test_the_backward_kernel_conforms(built: Path, name: str, target: str) -> None:
    """The backward host under rules='error' on both targets: every gradient written, the column input's
    [T, G] one included (its staging tile stored once per token tile)."""
    backward = getattr(_kernel(built, name, "backward_kernel.py", target), f"{name}_backward")
    inputs = tuple(t.contiguous() for t in _views(name, _leaves(name)))
    d_y = torch.randn((T, G, H), generator=torch.Generator().manual_seed(7)).bfloat16()
    grads = backward(*inputs, d_y, lnc=1 if target == "trn1" else None, target=target)
    exact = tuple(t.double().requires_grad_(True) for t in inputs)
    (FORMULAS[name](*exact) * d_y.double()).sum().backward()
    for got, leaf in zip(grads, exact, strict=True):
        assert leaf.grad is not None
        _close(got, leaf.grad)


def test_a_sum_over_the_tokens_is_refused_at_the_sum(tmp_path: Path) -> None:
    """Sums over heads or tokens stay backward-only: the forward refusal points at the sum, not an output."""
    spec = tmp_path / "token_sum.spec"
    spec.write_text("kernel token_sum\ndim T, G, H\ninput x: f32[T, G, H]\noutput y: f32[T, G, H]\n"
                    "output z: f32[G, H]\ny = x * 2.0\nz = sum(x, axis=0)\n"
                    "check T=3 G=2 H=128\n")  # fmt: skip
    ir, _ = load_spec(str(spec))
    with pytest.raises(Mismatch, match="carried only by the row-reduction backward kernel") as refused:
        ROWREDUCE.match(ir)
    assert (refused.value.span.line, refused.value.span.col) == (7, 5)


def test_the_generated_gradcheck_holds_where_the_output_is_flat_in_the_column(tmp_path: Path) -> None:
    """rmsnorm(x * s) is sign(s) rmsnorm(x): flat in |s|, steep only within eps of s = 0. The generated
    gradcheck once stepped s across zero (an element moves by up to eps = 1) and reported a difference of
    230 for a right gradient; its inputs now sit at least 1 from zero (conformance.away_from_zero)."""
    spec = tmp_path / "colin_scale2.spec"
    body = "input s: f32[T]\ninput w: bf16[H]\noutput y: bf16[T, H]\ny = rmsnorm(x * s[:, None], 1e-6, w)\n"
    spec.write_text(f"kernel colin_scale2\n{FLAT}{body}check T=130 H=384\n")  # op checks at T=32: s crosses 0
    assert main(["build", "--out", str(tmp_path / "gen"), str(spec)]) == 0
    generated_tests = load_generated(tmp_path / "gen" / "colin_scale2" / "test_colin_scale2.py")
    generated_tests.test_op_backward_passes_gradcheck()


def test_gradcheck_inputs_move_one_away_from_zero_exactly() -> None:
    t = torch.tensor([-2.5, -0.0, 0.0, 0.3, 1e-8, 3.0]).bfloat16()
    moved = away_from_zero(t)
    assert moved.dtype == torch.bfloat16
    assert moved.float().tolist() == [-3.5, 1.0, 1.0, 1.296875, 1.0, 4.0]  # 1.3 in bf16; -0.0 is not < 0
