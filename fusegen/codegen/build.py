"""`fusegen build`: spec -> checked IR -> family -> rendered files (written whole by codegen.output)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fusegen.codegen.backward import differentiate, inference_only
from fusegen.codegen.family import Family, Mismatch, no_family_error
from fusegen.codegen.ffn.family import FFN
from fusegen.codegen.files.ops import ops_files
from fusegen.codegen.files.reference import reference_source
from fusegen.codegen.files.report import plan_markdown
from fusegen.codegen.files.tests import test_source
from fusegen.codegen.fp8 import fp8_errors
from fusegen.codegen.plan import PlanError, TilePlan
from fusegen.codegen.proj.family import PROJ
from fusegen.codegen.rewrites import rewrite
from fusegen.codegen.rowreduce.family import ROWREDUCE
from fusegen.codegen.stage import StageError
from fusegen.dsl import load_spec
from fusegen.dsl.check import MAX_CHAIN, check_with_warnings
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.ir import CheckShape, KernelIR
from fusegen.dsl.parser import parse
from fusegen.dsl.source import read_spec
from fusegen.perf.targets import offered
from fusegen.sim.targets import TARGETS

FAMILIES: tuple[Family, ...] = (FFN, PROJ, ROWREDUCE)


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
    warnings: tuple[str, ...] = ()  # the checker's warnings (an input never read, ...), rendered


def build_spec(path: str, options: BuildOptions) -> Built:
    """Render every file of one spec; nothing is written."""
    source = read_spec(path)  # read once: checked here, and rendered with its warnings or errors
    user_ir, warnings = check_with_warnings(parse(source, path))
    try:
        with _recursion_limit(RECURSION_LIMIT):
            built = _render_spec(source, user_ir, options)
    except StageError as err:  # math a family's stage cannot express: the user's line, not a fusegen bug
        hint = "compute it outside the kernel and pass it in as a param"
        error = Diagnostic(err.node.span, err.message, hint=hint)
        raise SpecError([error, *warnings], source) from None
    except SpecError as err:  # the warnings may say why (an input never read is no family's input)
        raise SpecError([*err.diagnostics, *warnings], source) from None
    lines = source.split("\n")
    return dataclasses.replace(built, warnings=tuple(w.render(lines) for w in warnings))


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


def _render_spec(source: str, user_ir: KernelIR, options: BuildOptions) -> Built:
    ir = rewrite(user_ir)  # fusion identities first; reference.py keeps the spec's own (unfused) math
    family, match = select_family(ir, source)
    if errors := fp8_errors(ir, family.name, options.target):
        raise SpecError(errors, source)
    plans = _plans(family, ir, match, options, source)
    try:  # the backward stage: differentiate, then the family's backward kernels where it has them
        back = differentiate(user_ir, family, options.target, options.lnc)
    except PlanError as err:
        where = ir.checks[0].span if ir.checks else ir.outputs[0].span
        raise SpecError([Diagnostic(where, str(err))], source) from None
    files = {
        "kernel.py": family.kernel_source(ir, match, options.target, options.lnc),
        "reference.py": reference_source(user_ir),
        f"test_{ir.name}.py": test_source(user_ir, options.target, trainable=back is not None),
        "plan.md": plan_markdown(ir, family.name, family.planning, plans),
        **ops_files(user_ir, back, inference_only(user_ir, family)),
        **(back.files() if back is not None else {}),
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
            errors.append(Diagnostic(check.span, str(err), hint=plan_hint(options.target)))
    if errors:
        raise SpecError(errors, source)
    return tuple(plans)


def plan_shape(path: str, dims: dict[str, int], target: str, lnc: int) -> None:
    """SpecError with the planner's message and numbers when no tile plan fits `dims` (a --shape)."""
    ir = rewrite(load_spec(path)[0])
    source = Path(path).read_text(encoding="utf-8", errors="replace")
    family, match = select_family(ir, source)
    if errors := fp8_errors(ir, family.name, target):
        raise SpecError(errors, source)
    at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), dim_line(ir)),))
    try:
        family.plans(at, match, target, lnc)
    except PlanError as err:
        shape = " ".join(f"{k}={v}" for k, v in sorted(dims.items()))
        # at the dims --shape gives values to, as its other errors: the first check line is no part of it
        error = Diagnostic(dim_line(ir), f"--shape {shape}: {err}", hint=plan_hint(target))
        raise SpecError([error], source) from None


def dim_line(ir: KernelIR) -> Span:
    """The first `dim` line's dims, from its first name to its last."""
    first = ir.dims[0].span
    last = [d.span for d in ir.dims if d.span.line == first.line][-1]
    return dataclasses.replace(first, end_line=last.end_line, end_col=last.end_col)


def plan_hint(target: str) -> str:
    """What to do when no plan fits: shrink the shape, or build for an offered target with more SBUF
    (none is larger than trn2's, so there the hint does not send the user to trn1)."""
    usable = TARGETS[target].sbuf_usable_bytes
    larger = [t for t in offered() if TARGETS[t].sbuf_usable_bytes > usable]
    also = "".join(f", or build for --target {t} ({TARGETS[t].sbuf_usable_bytes} B of SBUF per partition)"
                   for t in larger)  # fmt: skip
    return f"shrink this shape{also}"


def select_family(ir: KernelIR, source: str) -> tuple[Family, object]:
    """The first family whose matcher accepts `ir`, and its match; else one error naming every family."""
    mismatches = []
    for family in FAMILIES:
        try:
            return family, family.match(ir)
        except Mismatch as miss:
            mismatches.append(miss)
    raise no_family_error(ir, mismatches, source)
