"""test_<name>.py and the cases `fusegen check`, `explain` and `bench` run: shapes, inputs, tolerances."""

from __future__ import annotations

from fusegen.codegen.files.reference import dim_bindings
from fusegen.codegen.files.render import header, render
from fusegen.codegen.plan import lnc_degrees
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import FP8_DTYPES, KernelIR, eval_shape
from fusegen.sim.targets import get_target
from fusegen.testing import Case, Tolerance, tolerance

#: Logical-core degrees a generated test runs, those the build's target has (plan.lnc_degrees).
TEST_LNCS = (1, 2)


def test_inputs(ir: KernelIR) -> tuple[tuple[str, str, str], ...]:
    """(input, dtype, scale) of every input: matmul weights are scaled by 1/sqrt(fan-in)."""
    fan_in = {ir.node(n.args[1]).name for n in ir.nodes if n.op == "matmul"}
    return tuple((i.name, i.dtype, "fan_in" if i.name in fan_in else "1") for i in ir.inputs)


def test_case(ir: KernelIR, dims: dict[str, int]) -> Case:
    """What the generated test runs at `dims`, from the IR: `fusegen check` and `explain` need no pytest."""
    env = {**ir.fixed_dims(), **dims}
    shapes = {i.name: eval_shape(i.shape, env) for i in ir.inputs}
    save = any(o.optional for o in ir.outputs)
    return Case(test_inputs(ir), output_tolerances(ir), dims, shapes, save=save)


def test_source(ir: KernelIR, target: str, trainable: bool) -> str:
    """test_<name>.py: the interpreter against the reference at every check shape and ragged variants, and
    the op's torch conformance (opcheck; gradcheck where the op trains)."""
    differentiated = [i for i, o in enumerate(ir.outputs) if not o.optional]
    inputs = test_inputs(ir)
    shapes = ", ".join(f'"{i.name}": {_tuple_source([dim_source(d) for d in i.shape])}' for i in ir.inputs)
    shapes = "{" + shapes + "}"
    return render(
        "test_kernel.py.jinja", header=header(ir, "test_kernel.py.jinja"), name=ir.name, target=target,
        shapes=[(repr(dims), label) for dims, label in test_shapes(ir)], inputs=repr(inputs),
        outputs=repr(output_tolerances(ir)), save=any(o.optional for o in ir.outputs),
        dim_lines=[f'd_{name} = dims["{name}"]' for name, _ in dim_bindings(ir, str) if _is_free(ir, name)]
        + [f"d_{d.name} = {d.value}" for d in ir.dims if d.value is not None],
        input_shapes=shapes, lncs=repr([n for n in TEST_LNCS if n in lnc_degrees(get_target(target))]),
        op_dims=repr(op_check_dims(ir)),
        trainable=trainable, differentiated=repr(tuple(differentiated)),
        dtypes=repr(tuple(sorted({i.dtype for i in ir.inputs} | {o.dtype for o in ir.outputs}))),
    )  # fmt: skip


def _tuple_source(items: list[str]) -> str:
    """Python source of a tuple of `items`: `()` for a scalar, else `(a,)`, `(a, b,)`."""
    return f"({', '.join(items)},)" if items else "()"


def output_tolerances(ir: KernelIR) -> tuple[Tolerance, ...]:
    """(output, rtol, atol) for every output the generated test checks (optional ones too)."""
    return tuple((o.name, *tolerance(o.dtype, _rounded(ir, o.node))) for o in ir.outputs)


def _rounded(ir: KernelIR, node_id: int) -> bool:
    """Whether a cast to bf16/f16/fp8 lies upstream of the node (inputs are read exactly on both sides)."""
    seen, todo = {node_id}, [node_id]
    while todo:
        node = ir.node(todo.pop())
        if node.op == "cast" and node.dtype in ("bf16", "f16", *FP8_DTYPES):
            return True
        todo += [a for a in node.args if a not in seen]
        seen.update(node.args)
    return False


def _is_free(ir: KernelIR, name: str) -> bool:
    return any(d.name == name and d.value is None for d in ir.dims)


def test_shapes(ir: KernelIR) -> list[tuple[dict[str, int], str]]:
    """The check shapes, plus the smallest with one free dim moved by one (ragged) where constraints allow."""
    shapes = [(c.env(), "check-" + "-".join(f"{k}{v}" for k, v in c.dims)) for c in ir.checks]
    if not shapes:
        return shapes
    smallest = min((c.env() for c in ir.checks), key=lambda env: sorted(env.values()))
    env_all = {**ir.fixed_dims(), **smallest}
    seen = {tuple(sorted(env.items())) for env, _ in shapes}
    # a dim the spec fixes cannot move, and one no input's shape uses would test nothing
    movable = {s for i in ir.inputs for d in i.shape for s in d.symbols()} - set(ir.fixed_dims())
    for name in sorted(movable & set(smallest)):
        for value in (smallest[name] - 1, smallest[name] + 1):
            env = {**smallest, name: value}
            full = {**env_all, name: value}
            allowed = value >= 1 and all(c.holds(full) for c in ir.constraints)
            if allowed and tuple(sorted(env.items())) not in seen:
                shapes.append((env, f"ragged-{name}{value}"))
                break
    return shapes


#: sizes a free dim of the op checks' shape tries, smallest first
_SMALL_SIZES = (32, 64, 128, 256, 512, 1024)


def op_check_dims(ir: KernelIR) -> dict[str, int]:
    """A small shape for the op checks (opcheck, gradcheck): the smallest check shape with each free dim
    shrunk to the smallest size the spec's requires allow."""
    if not ir.checks:
        return {}
    envs = [c.env() for c in ir.checks]
    env = min(envs, key=lambda dims: sorted(dims.values()))
    for name in sorted(env):
        for size in (s for s in _SMALL_SIZES if s < env[name]):
            if all(c.holds({**ir.fixed_dims(), **env, name: size}) for c in ir.constraints):
                env[name] = size
                break
    return env
