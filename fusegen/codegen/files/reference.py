"""The torch reference: one line of eager torch per IR node, f32 math, casts rounding where the spec says."""

from __future__ import annotations

from collections.abc import Callable

from fusegen.codegen.files.reference_chunks import MEMORY_BUDGET, row_chunks
from fusegen.codegen.files.render import header, render
from fusegen.codegen.stage import dim_source
from fusegen.dsl.dim_sources import DimSource, dim_sources
from fusegen.dsl.ir import Dim, IndexItem, KernelIR, Node

TORCH_DTYPE = {
    "bf16": "torch.bfloat16",
    "f16": "torch.float16",
    "f32": "torch.float32",
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
}

_UNARY = {
    "neg": "-{}",
    "silu": "F.silu({})",
    "gelu": "F.gelu({})",
    "gelu_tanh": 'F.gelu({}, approximate="tanh")',
    "relu": "F.relu({})",
    "sigmoid": "torch.sigmoid({})",
    "tanh": "torch.tanh({})",
    "exp": "torch.exp({})",
    "log": "torch.log({})",
    "sqrt": "torch.sqrt({})",
    "rsqrt": "torch.rsqrt({})",
    "abs": "torch.abs({})",
    "sign": "torch.sign({})",
    "square": "torch.square({})",
    "erf": "torch.special.erf({})",  # backward IR only (codegen/autodiff.py)
}
_BINARY = {
    "add": "{} + {}",
    "sub": "{} - {}",
    "mul": "{} * {}",
    "div": "{} / {}",
    "matmul": "{} @ {}",
    "maximum": "torch.maximum({}, {})",
    "minimum": "torch.minimum({}, {})",
    "lt": "{} < {}",
    "le": "{} <= {}",
    "gt": "{} > {}",
    "ge": "{} >= {}",
    "eq": "{} == {}",
    "ne": "{} != {}",
}


def value_name(node: Node) -> str:
    """The reference's local for a node: `_<name>` where the spec names it, else `_<id>` (spec names start
    with a letter, so no local can shadow an argument or another local)."""
    return f"_{node.id}" if node.name is None or node.op in ("input", "param") else f"_{node.name}"


def reference_lines(ir: KernelIR) -> list[str]:
    """Body lines computing every node, in order."""
    lines = [f"d_{name} = {expr}" for name, expr in dim_bindings(ir, lambda n: n)]
    for node in ir.nodes:
        if node.op != "param":
            lines.append(f"{value_name(node)} = {_expr(ir, node)}")
    return lines


def dim_bindings(
    ir: KernelIR, arg: Callable[[str], str], skip: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """(dim, source) pairs binding each dim: fixed values and whole input axes by name, then the dims
    solved from compound axes (`2*D`) in the order their sources need (dim_sources.py); inputs named in
    `skip` (passed to a kernel in another layout) are no source."""
    fixed = {d.name: str(d.value) for d in ir.dims if d.value is not None}
    sources = dim_sources([i for i in ir.inputs if i.name not in skip], fixed)
    plain = {s.name: f"{arg(s.input)}.shape[{s.axis}]" for s in sources if s.plain}
    solved = [(s.name, _solved(s, arg)) for s in sources if not s.plain]
    return sorted({**fixed, **plain}.items()) + solved


def _solved(source: DimSource, arg: Callable[[str], str]) -> str:
    """`(x.shape[1] - d_NQ) // 2`: a dim from an axis linear in it, over dims bound before it."""
    axis = f"{arg(source.input)}.shape[{source.axis}]"
    if source.rest != Dim.const(0):
        axis = f"({axis} - {dim_source(source.rest)})"
    return axis if source.coef == 1 else f"{axis} // {source.coef}"


def _expr(ir: KernelIR, node: Node) -> str:
    args = [_operand(ir, a) for a in node.args]
    if node.op == "input":
        return f"{node.name}.float()"
    if node.op == "const":
        return repr(float(node.attr("value")))  # type: ignore[arg-type]
    if node.op == "dim":
        return f"float({dim_source(node.attr('dim'))})"  # type: ignore[arg-type]
    if node.op in _UNARY:
        return _UNARY[node.op].format(_tensor(ir, node.args[0], args[0]))
    if node.op in ("maximum", "minimum"):  # torch.maximum takes tensors only, not a Python float
        return _BINARY[node.op].format(
            *(_tensor(ir, a, code) for a, code in zip(node.args, args, strict=True))
        )
    if node.op in _BINARY:
        return _BINARY[node.op].format(*args)
    return _SPECIAL[node.op](node, args)


def _operand(ir: KernelIR, node_id: int) -> str:
    node = ir.node(node_id)
    if node.op == "param":
        return f"float({node.name})"
    return value_name(node) if node.op not in ("const", "dim") else f"({value_name(node)})"


def _tensor(ir: KernelIR, node_id: int, code: str) -> str:
    """Scalars are Python floats or 0-d tensors (`-limit`): torch's unary functions need a tensor."""
    return f"torch.as_tensor({code})" if ir.node(node_id).shape == () else code


def _index(node: Node, args: list[str]) -> str:
    items: tuple[IndexItem, ...] = node.attr("index")  # type: ignore[assignment]
    parts = [
        dim_source(it.start)
        if it.kind == "at"
        else f"{dim_source(it.start)}:{dim_source(it.stop or it.start)}"
        for it in items
    ]
    return f"{args[0]}[{', '.join(parts)}]"


def _reduce(method: str) -> Callable[[Node, list[str]], str]:
    return lambda node, args: f"{args[0]}.{method}(dim={node.attr('axis')}, keepdim={node.attr('keepdim')})"


def _norm(node: Node, args: list[str]) -> str:
    x, eps, *affine = args
    gamma, beta = [*affine, "None", "None"][:2]
    if node.op == "layernorm":
        return f"F.layer_norm({x}, ({x}.shape[-1],), {gamma}, {beta}, {eps})"
    scaled = f"{x} * torch.rsqrt({x}.square().mean(dim=-1, keepdim=True) + {eps})"
    return f"{scaled} * {gamma}" if affine else scaled


def _unindex(node: Node, args: list[str]) -> str:
    """Zeros of the source shape with the operand at the index: new axes for positions, then padding."""
    items: tuple[IndexItem, ...] = node.attr("index")  # type: ignore[assignment]
    lifted = args[0]
    if any(it.kind == "at" for it in items):
        lifted += f"[{', '.join('None' if it.kind == 'at' else ':' for it in items)}]"
    pads = []
    for it, dim in reversed(list(zip(items, node.shape, strict=True))):
        stop = it.stop if it.kind == "slice" and it.stop is not None else it.start + 1
        pads += [dim_source(it.start), dim_source(dim - stop)]
    return f"F.pad({lifted}, ({', '.join(pads)}))" if set(pads) != {"0"} else lifted


def _expand(node: Node, args: list[str]) -> str:
    return f"torch.as_tensor({args[0]}).expand({', '.join(dim_source(d) for d in node.shape)})"


_SPECIAL: dict[str, Callable[[Node, list[str]], str]] = {
    "pow": lambda node, args: f"{args[0]} ** {float(node.attr('exponent'))!r}",  # type: ignore[arg-type]
    "sum": _reduce("sum"),
    "mean": _reduce("mean"),
    "max": _reduce("amax"),
    "clamp": lambda node, args: f"{args[0]}.clamp(min={node.attr('lo')!r}, max={node.attr('hi')!r})",
    "where": lambda node, args: "torch.where({}, {}, {})".format(*args),
    "layernorm": _norm,
    "rmsnorm": _norm,
    "cast": lambda node, args: f"{args[0]}.to({TORCH_DTYPE[node.dtype]}).float()",
    "index": _index,
    # backward IR only (codegen/autodiff.py)
    "unindex": _unindex,
    "expand": _expand,
    "transpose": lambda node, args: f"{args[0]}.transpose(-1, -2)",
}


def reference_source(ir: KernelIR) -> str:
    """reference.py for any family."""
    params = [i.name for i in ir.inputs] + [f"{p.name}={p.default!r}" for p in ir.params]
    optional = [o for o in ir.outputs if o.optional]
    if optional:
        params.append("save=False")
    names = {o.name: _output_expr(ir, o.node, o.dtype) for o in ir.outputs}
    chunks = row_chunks(ir)
    args = [i.name for i in ir.inputs] + [p.name for p in ir.params] + (["save"] if optional else [])
    sliced = [f"{a}[_r0:_r0 + _step]" if chunks and a in chunks.row_inputs else a for a in args]
    return render(
        "reference.py.jinja", header=header(ir, "reference.py.jinja"), name=ir.name, params=", ".join(params),
        lines=reference_lines(ir), optional=[names[o.name] for o in optional],
        required=[names[o.name] for o in ir.outputs if not o.optional], chunks=chunks,
        args=", ".join(args), sliced=", ".join(sliced), budget=MEMORY_BUDGET,
        bindings=[f"d_{d} = {src}" for d, src in dim_bindings(ir, lambda n: n)],
    )  # fmt: skip


def _output_expr(ir: KernelIR, node_id: int, dtype: str) -> str:
    return f"{value_name(ir.node(node_id))}.to({TORCH_DTYPE[dtype]})"
