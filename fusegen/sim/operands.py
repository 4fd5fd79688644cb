"""Argument decoding shared by the nisa instructions: engines, ops, scalar-or-vector operands."""

from __future__ import annotations

import enum

import torch

from .conformance import engine_problem, message, pick_engine, violation
from .errors import InvalidArgumentError, ShapeMismatchError, fault
from .instr import Instr
from .memory import MemoryRegion
from .ops import Op, engine
from .rule_tables import ALU_OPS, NOT_HARDWARE, UNARY_IN_TENSOR_SCALAR
from .rules import RULES
from .tensor import NkiTensor

PSUM = (MemoryRegion.psum,)


def engine_name(value: object, default: str, allowed: tuple[str, ...], op: str) -> str:
    """Resolve an `engine=` argument (unknown -> default) and validate it."""
    if value is None or value is engine.unknown:
        return default
    if isinstance(value, int):  # rules.py enum-members (an always rule: no instruction exists yet)
        rule = RULES["enum-members"]
        raise fault(rule.error, op, message(rule, f"engine={value!r} is not an nisa.engine member"))
    if not isinstance(value, engine) or value.value not in allowed:
        raise fault(InvalidArgumentError, op, f"engine={value} not allowed; choose from {allowed}")
    return value.value


def enum_member(ins: Instr, value: object, kind: type[enum.Enum], role: str) -> None:
    """rules.py enum-members: an enum parameter takes a member of its enum (None: the API default)."""
    if value is not None and not isinstance(value, kind):
        violation(ins, "enum-members", f"{role}={value!r} is not an nisa.{kind.__name__} member")


def start(op: str, engine_value: object, default: str, allowed: tuple[str, ...]) -> Instr:
    """Begin an instruction on the resolved engine."""
    return Instr(op, engine_name(engine_value, default, allowed, op))


def alu_engine(ins: Instr, value: object, choices: tuple[str, ...], ops: tuple[str, ...]) -> None:
    """Set ins.engine: an explicit engine is checked against the ALU rules, unknown picks a legal one."""
    nc = ins.ctx.target.nc_version
    if value is None or value is engine.unknown:
        ins.engine = pick_engine(ins.op, choices, ops, nc)
        where = f"no engine of {choices} runs"  # pick_engine fell back to the first: none is legal
    else:
        ins.engine = engine_name(value, choices[0], choices, ins.op)
        where = f"engine={ins.engine} with"
    problem = engine_problem(ins.op, ins.engine, ops, nc)
    if problem is not None:
        violation(ins, problem, f"{where} op(s) {', '.join(o for o in ops if o)}")


def require_op(ins: Instr, op: object, role: str, arity: int | None = None) -> Op:
    """Validate an op constant (and its arity)."""
    if not isinstance(op, Op):
        raise ins.fail(InvalidArgumentError, f"{role} must be an nl op constant (e.g. nl.add), got {op!r}")
    if arity is not None and op.arity != arity:
        kind = "binary ALU" if arity == 2 else "unary activation"
        raise ins.fail(InvalidArgumentError, f"{role}={op!r} is not a {kind} op")
    return op


def alu_op(ins: Instr, op: object, role: str, unary: bool = False) -> Op:
    """An ALU operator of the table (binary, or a unary one where `unary` allows it)."""
    fn = require_op(ins, op, role)
    if fn.name not in ALU_OPS:
        rule = "alu-no-divide" if fn.name in NOT_HARDWARE else "alu-op-table"
        violation(ins, rule, f"{role}={fn!r} is not an ALU operator of the hardware")
    if fn.arity != 2 and not (unary and fn.name in UNARY_IN_TENSOR_SCALAR):
        raise ins.fail(InvalidArgumentError, f"{role}={fn!r} is not a binary ALU op")
    return fn


def as_rows(ins: Instr, t: NkiTensor, role: str) -> torch.Tensor:
    """Read `t` as fp32 [partitions, elements per partition]."""
    rows = ins.read_f32(t, role)
    return rows if rows.dim() == 2 else rows.reshape(t.partitions, t.free_size)


def int_rows(ins: Instr, t: NkiTensor, role: str, bits: bool = False) -> torch.Tensor:
    """Read an integer tile's raw values as int64 [partitions, elements per partition]; with `bits`, as the
    unsigned bit patterns (bitvec ops: right_shift is a logical shift, SH tbl-aluop; stores wrap back)."""
    rows = ins.read(t, role).to(torch.int64).reshape(t.partitions, t.free_size)
    if bits and t.dtype.is_signed:
        rows = rows & ((1 << (8 * t.dtype.itemsize)) - 1)
    return rows


def scalar_or_column(
    ins: Instr, value: object, partitions: int, role: str, integer: bool = False
) -> torch.Tensor | float:
    """A Python number, or a [P,1] tensor that broadcasts along free dims (fp32, or int64 bit patterns if
    `integer`)."""
    if isinstance(value, bool) or value is None:
        raise ins.fail(InvalidArgumentError, f"{role} must be a number or a [P,1] tensor, got {value!r}")
    if isinstance(value, int | float):
        return torch.tensor(int(value), dtype=torch.int64) if integer else float(value)
    t = ins.tensor(value, role)
    ins.on_chip((t, role))
    if t.partitions != partitions or t.free_size != 1:
        raise ins.fail(
            ShapeMismatchError, f"{role} must be [{partitions}, 1] (one value per partition), got {t.shape}"
        )
    if integer:
        return int_rows(ins, t, role, bits=True)
    column = ins.read_f32(t, role)
    return column if len(t.shape) == 2 else column.reshape(partitions, 1)  # a [P, 1] view is one already


def apply(op: Op, a: torch.Tensor | float, b: torch.Tensor | float, reverse: bool = False) -> torch.Tensor:
    """`a op b` (or `b op a` when reverse) in fp32 with broadcasting."""
    x, y = (b, a) if reverse else (a, b)
    if not isinstance(x, torch.Tensor):
        x = torch.tensor(x, dtype=torch.float32)
    if not isinstance(y, torch.Tensor):
        y = torch.tensor(y, dtype=torch.float32)
    return op.fn(x, y)
