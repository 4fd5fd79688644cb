"""`fusegen build`: spec -> checked IR -> family -> rendered files (written whole by codegen.output)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fusegen.codegen.family import Family, Mismatch, no_family_error
from fusegen.codegen.ffn.family import FFN
from fusegen.codegen.files.ops import TRAINABLE_FAMILIES, ops_files
from fusegen.codegen.files.reference import TORCH_DTYPE, dim_bindings, reference_lines, value_name
from fusegen.codegen.files.reference_chunks import MEMORY_BUDGET, row_chunks
from fusegen.codegen.files.render import header, render
from fusegen.codegen.files.report import plan_markdown
from fusegen.codegen.plan import PlanError, TilePlan, lnc_degrees
from fusegen.codegen.rewrites import rewrite
from fusegen.codegen.rowreduce.family import ROWREDUCE
from fusegen.codegen.stage import StageError, dim_source
from fusegen.dsl import load_spec
from fusegen.dsl.check import MAX_CHAIN
from fusegen.dsl.diagnostics import Diagnostic, SpecError
from fusegen.dsl.ir import CheckShape, KernelIR, eval_shape
from fusegen.dsl.source import read_spec
from fusegen.sim.targets import get_target
from fusegen.testing import Case, Tolerance, tolerance

FAMILIES: tuple[Family, ...] = (FFN, ROWREDUCE)
#: Logical-core degrees a generated test runs, those the build's target has (plan.lnc_degrees).
TEST_LNCS = (1, 2)
PLAN_HINT = "shrink this shape, or build for another --target"


@dataclass(frozen=True)
class BuildOptions:
    """Where and for what to build."""

    out_dir: Path = Path("generated")
    target: str = "trn2"
    lnc: int = 2


@dataclass(frozen=True)
class Built:
    """One spec's generated files, by path relative to the output directory."""

    name: str
    files: tuple[tuple[str, str], ...]
    plans: tuple[TilePlan, ...]


def build_spec(path: str, options: BuildOptions) -> Built:
    """Render every file of one spec; nothing is written."""
    user_ir, _warnings = load_spec(path)
    try:
        with _recursion_limit(RECURSION_LIMIT):
            return _render_spec(path, user_ir, options)
    except StageError as err:  # math a family's stage cannot express: the user's line, not a fusegen bug
        hint = "compute it outside the kernel and pass it in as a param"
        raise SpecError([Diagnostic(err.node.span, err.message, hint=hint)], read_spec(path)) from None


#: lowering and selection walk value chains recursively; the checker bounds a chain at MAX_CHAIN
#: operations and a built-in expands into a few levels each, so this many frames always suffice.
RECURSION_LIMIT = 20 * MAX_CHAIN * 10


@contextlib.contextmanager
def _recursion_limit(limit: int) -> Iterator[None]:
    """Raise Python's recursion limit (never lower it) for the duration."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def _render_spec(path: str, user_ir: KernelIR, options: BuildOptions) -> Built:
    ir = rewrite(user_ir)  # fusion identities first; reference.py keeps the spec's own (unfused) math
    source = read_spec(path)
    family, match = select_family(ir, source)
    plans = _plans(family, ir, match, options, source)
    try:  # with the backward's own kernels where the family carries its IR
        ops = ops_files(user_ir, family.name, options.target, options.lnc)
    except PlanError as err:
        where = ir.checks[0].span if ir.checks else ir.outputs[0].span
        raise SpecError([Diagnostic(where, str(err))], source) from None
    files = {
        "kernel.py": family.kernel_source(ir, match, options.target, options.lnc),
        "reference.py": reference_source(user_ir),
        f"test_{ir.name}.py": test_source(user_ir, options.target, family.name),
        "plan.md": plan_markdown(ir, family.name, family.planning, plans),
        **ops,
    }
    return Built(ir.name, tuple((f"{ir.name}/{name}", text) for name, text in sorted(files.items())), plans)


def _plans(family: Family, ir: KernelIR, match: object, options: BuildOptions, source: str
           ) -> tuple[TilePlan, ...]:  # fmt: skip
    """One plan per check line; a check no plan fits is an error at that line."""
    plans: list[TilePlan] = []
    errors = []
    for check in ir.checks:
        try:
            at = dataclasses.replace(ir, checks=(check,))
            plans += family.plans(at, match, options.target, options.lnc)
        except PlanError as err:
            errors.append(Diagnostic(check.span, str(err), hint=PLAN_HINT))
    if errors:
        raise SpecError(errors, source)
    return tuple(plans)


def plan_shape(path: str, dims: dict[str, int], target: str, lnc: int) -> None:
    """SpecError with the planner's message and numbers when no tile plan fits `dims` (a --shape)."""
    ir = rewrite(load_spec(path)[0])
    source = Path(path).read_text(encoding="utf-8", errors="replace")
    family, match = select_family(ir, source)
    where = ir.checks[0].span if ir.checks else ir.outputs[0].span
    at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), where),))
    try:
        family.plans(at, match, target, lnc)
    except PlanError as err:
        shape = " ".join(f"{k}={v}" for k, v in sorted(dims.items()))
        raise SpecError([Diagnostic(where, f"--shape {shape}: {err}", hint=PLAN_HINT)], source) from None


def select_family(ir: KernelIR, source: str) -> tuple[Family, object]:
    """The first family whose matcher accepts `ir`, and its match; else one error naming every family."""
    mismatches = []
    for family in FAMILIES:
        try:
            return family, family.match(ir)
        except Mismatch as miss:
            mismatches.append(miss)
    raise no_family_error(ir, mismatches, source)


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


def test_source(ir: KernelIR, target: str, family: str) -> str:
    """test_<name>.py: the interpreter against the reference at every check shape and ragged variants, and
    the op's torch conformance (opcheck; gradcheck where the family trains)."""
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
        trainable=family in TRAINABLE_FAMILIES, differentiated=repr(tuple(differentiated)),
        dtypes=repr(tuple(sorted({i.dtype for i in ir.inputs} | {o.dtype for o in ir.outputs}))),
    )  # fmt: skip


def _tuple_source(items: list[str]) -> str:
    """Python source of a tuple of `items`: `()` for a scalar, else `(a,)`, `(a, b,)`."""
    return f"({', '.join(items)},)" if items else "()"


def output_tolerances(ir: KernelIR) -> tuple[Tolerance, ...]:
    """(output, rtol, atol) for every output the generated test checks (optional ones too)."""
    return tuple((o.name, *tolerance(o.dtype, _rounded(ir, o.node))) for o in ir.outputs)


def _rounded(ir: KernelIR, node_id: int) -> bool:
    """Whether a cast to bf16/f16 lies upstream of the node (inputs are read exactly on both sides)."""
    seen, todo = {node_id}, [node_id]
    while todo:
        node = ir.node(todo.pop())
        if node.op == "cast" and node.dtype in ("bf16", "f16"):
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

