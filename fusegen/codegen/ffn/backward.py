"""The FFN backward's plan: what the backward recomputes and what the forward would have to save.

The backward of an FFN (autodiff.py) needs the forward's up-projections (for the activations' derivatives),
the combine h (for dW2 = h^T @ dY) and, under a row-wise epilogue that is not linear (a norm), the
down-projection's output. Each can be saved by the forward or recomputed from x by the backward: saving
costs activation memory held from the forward to the backward and HBM traffic (written once, read once),
recomputing costs the recomputed GEMMs' FLOPs on the PE. The planner prices every strategy with the same
machine figures as the kernels' time model, keeps those the forward kernel can serve, and takes the least
modelled time; backward_plan.md shows all of them, with the bytes saved per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.autodiff import GRAD_PREFIX
from fusegen.codegen.ffn.match import FfnMatch
from fusegen.codegen.files.render import header, render
from fusegen.dsl.ir import KernelIR, Node
from fusegen.perf.roofline import hbm_bytes_per_ns, pe_peak_flops_per_ns
from fusegen.sim.targets import get_target

TEMPLATE = "ffn_backward_plan.md.jinja"
#: the FFN forward kernel writes the spec's [R, K] outputs only; a saved [R, I] value needs a forward
#: kernel with [R, I] outputs, which the family does not generate yet
NO_INTER_OUTPUTS = "needs [R, I] forward outputs; the FFN forward kernel writes only [R, K] outputs"


@dataclass(frozen=True)
class Strategy:
    """One save-vs-recompute choice, per token: bytes the forward saves, FLOPs the backward recomputes."""

    name: str
    saved: str  # what the forward saves, in words
    saved_bytes: int  # per token
    recompute_flops: int  # per token
    unavailable: str = ""  # why the forward kernel cannot serve it ("" when it can)


@dataclass(frozen=True)
class Priced:
    """A strategy's modelled extra backward time per token (ns) at one target and LNC."""

    strategy: Strategy
    recompute_ns: float
    traffic_ns: float

    @property
    def ns(self) -> float:
        """Extra time per token over a backward that has every forward value for free."""
        return self.recompute_ns + self.traffic_ns


@dataclass(frozen=True)
class BackwardFlops:
    """Per-token GEMM FLOPs of the backward: the gradient GEMMs (2x the forward's) and the recomputation."""

    forward: int
    gradients: int
    recompute: int


def gemm_flops(ir: KernelIR, m: FfnMatch, dims: dict[str, int]) -> tuple[int, int, int]:
    """Per-token FLOPs of (the up-projections, the down-projection, the whole forward) at `dims`."""
    k, i = m.hidden.eval(dims), m.inter.eval(dims)
    up = 2 * k * i * len(m.ups)
    return up, 2 * k * i, up + 2 * k * i


def backward_flops(ir: KernelIR, back: KernelIR, m: FfnMatch, dims: dict[str, int]) -> BackwardFlops:
    """FLOPs per token: each forward GEMM gives two gradient GEMMs (dA = dC @ B^T, dB = A^T @ dC), and the
    backward IR's matmuls that read no gradient are recomputations of the forward."""
    _, _, forward = gemm_flops(ir, m, dims)
    rows = m.rows.eval(dims)
    recompute = sum(_matmul_flops(n, back, dims) for n in back.nodes
                    if n.op == "matmul" and not _reads_gradient(back, n))  # fmt: skip
    return BackwardFlops(forward, 2 * forward, recompute // rows)


def _matmul_flops(n: Node, ir: KernelIR, dims: dict[str, int]) -> int:
    a, b = (ir.node(x).shape for x in n.args)
    return 2 * a[-2].eval(dims) * a[-1].eval(dims) * b[-1].eval(dims)


def _reads_gradient(ir: KernelIR, n: Node) -> bool:
    """Whether `n` depends on an output gradient (a `d_<output>` input of the backward IR)."""
    seen: set[int] = set()
    todo = [n.id]
    while todo:
        node = ir.node(todo.pop())
        if node.op == "input" and str(node.name).startswith(GRAD_PREFIX):
            return True
        todo += [a for a in node.args if a not in seen]
        seen.update(node.args)
    return False


def strategies(ir: KernelIR, m: FfnMatch, back: KernelIR, dims: dict[str, int]) -> tuple[Strategy, ...]:
    """The save-vs-recompute choices of this FFN at `dims`, per token."""
    up, _, _ = gemm_flops(ir, m, dims)
    k, i = m.hidden.eval(dims), m.inter.eval(dims)
    recompute_all = backward_flops(ir, back, m, dims).recompute
    needs_y = recompute_all > up  # the epilogue's derivative reads the down-projection's output
    y_word, y_bytes = (" and the epilogue's f32 input y", 4 * k) if needs_y else ("", 0)
    ups = f"{len(m.ups)} up-projection{'s' if len(m.ups) > 1 else ''}"
    return (
        Strategy("recompute all from x", "nothing", 0, recompute_all),
        Strategy("save bf16 h", f"the combine h{y_word}", 2 * i + y_bytes,
                 up, NO_INTER_OUTPUTS),  # act' still needs the up-projections
        Strategy("save the up-projections", f"the {ups} (bf16, before the activation){y_word}",
                 2 * i * len(m.ups) + y_bytes, 0, NO_INTER_OUTPUTS),
    )  # fmt: skip


def price(s: Strategy, target: str, lnc: int) -> Priced:
    """Recomputation at the PE's dense peak, saved bytes written by the forward and read by the backward at
    the cores' share of HBM bandwidth (the roofline's figures)."""
    t = get_target(target)
    pe, hbm = pe_peak_flops_per_ns(t) * lnc, hbm_bytes_per_ns(t) * lnc
    return Priced(s, s.recompute_flops / pe, 2 * s.saved_bytes / hbm)


def choose(priced: tuple[Priced, ...]) -> Priced:
    """The least modelled time among the strategies the forward kernel serves."""
    return min((p for p in priced if not p.strategy.unavailable), key=lambda p: p.ns)


@dataclass(frozen=True)
class ShapePlan:
    """backward_plan.md's section for one check shape."""

    title: str
    flops: BackwardFlops
    priced: tuple[Priced, ...]
    chosen: Priced
    fastest: Priced


def plan_shape(ir: KernelIR, m: FfnMatch, back: KernelIR, dims: dict[str, int], target: str,
               lnc: int) -> ShapePlan:  # fmt: skip
    """Every strategy priced at one shape, the chosen one, and the fastest if the forward saved anything."""
    priced = tuple(price(s, target, lnc) for s in strategies(ir, m, back, dims))
    title = " ".join(f"{k}={v}" for k, v in sorted(dims.items()))
    return ShapePlan(title, backward_flops(ir, back, m, dims), priced, choose(priced),
                     min(priced, key=lambda p: p.ns))  # fmt: skip


def backward_plan(ir: KernelIR, m: FfnMatch, back: KernelIR, target: str, lnc: int) -> str:
    """backward_plan.md: the save-vs-recompute decision at every check shape."""
    shapes = [plan_shape(ir, m, back, {**ir.fixed_dims(), **c.env()}, target, lnc) for c in ir.checks]
    outputs = {o.name for o in ir.outputs}
    return render(
        TEMPLATE, header=header(ir, TEMPLATE, comment="<!--").replace("\n", " -->\n") + " -->",
        name=ir.name, target=target, lnc=lnc, shapes=shapes,
        read_outputs=", ".join(f"`{i.name}`" for i in back.inputs if i.name in outputs),
    )  # fmt: skip
