"""`fusegen build` and `fusegen check`: what the CLI runs, with progress on stderr."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from fusegen.codegen.build import (
    FAMILIES,
    BuildOptions,
    build_spec,
    stale_files,
    test_case,
    test_shapes,
    write_atomically,
)
from fusegen.dsl import load_spec
from fusegen.dsl.diagnostics import Diagnostic, SpecError
from fusegen.dsl.ir import KernelIR
from fusegen.testing import run_against_reference


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(specs: list[str], options: BuildOptions, check_only: bool = False, every_spec: bool = False) -> int:
    """Build every spec (all rendered before any is written); with check_only, report stale files (and,
    when `specs` are all the project's, kernel folders no spec builds any more)."""
    built = []
    for spec in specs:
        _progress(f"fusegen: building {spec}")
        built.append(build_spec(spec, options))
    if check_only:
        stale = [rel for b in built for rel in stale_files(options.out_dir, b)]
        if every_spec and options.out_dir.is_dir():
            names = {b.name for b in built} | {"__pycache__"}
            folders = [p.name for p in options.out_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
            stale += sorted(f"{name}/" for name in folders if name not in names)
        for rel in stale:
            print(f"stale: {options.out_dir / rel}")
        if stale:
            print(f"{len(stale)} generated file(s) differ from `fusegen build`; run it and commit the result")
        return 1 if stale else 0
    for b in built:
        changed = write_atomically(options.out_dir, b.files)
        print(f"{b.name}: {len(b.files)} files in {options.out_dir / b.name}, {len(changed)} changed")
    return 0


def check(specs: list[str], options: BuildOptions, shapes: list[dict[str, int]]) -> int:
    """Build to a temporary directory and run each kernel on the interpreter against its reference."""
    failures = 0
    with tempfile.TemporaryDirectory(prefix="fusegen-check-") as tmp:
        out = Path(tmp)
        for spec in specs:
            ir, _ = load_spec(spec)
            runs = [validated_shape(ir, spec, dims) for dims in shapes] or [env for env, _ in test_shapes(ir)]
            built = build_spec(spec, BuildOptions(out, options.target, options.lnc))
            write_atomically(out, built.files)
            for dims in runs:
                _progress(f"fusegen: running {built.name} at {_dims_text(dims)} on the interpreter")
                case = test_case(ir, dims)
                report = run_against_reference(
                    out / built.name, built.name, case, options.lnc, options.target
                )
                print(report.text())
                failures += not report.ok
    return 1 if failures else 0


def _dims_text(dims: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


def validated_shape(ir: KernelIR, spec: str, dims: dict[str, int]) -> dict[str, int]:
    """`--shape` dims, checked like a `check` line: every free dim given, constraints hold."""
    source = Path(spec).read_text(encoding="utf-8", errors="replace")
    free = [d for d in ir.dims if d.value is None]
    errors = [
        Diagnostic(d.span, f"--shape does not give dim `{d.name}`", hint=f"add {d.name}=N")
        for d in free
        if d.name not in dims
    ]
    known = {d.name for d in ir.dims}
    errors += [
        Diagnostic(ir.dims[0].span, f"--shape names `{name}`, which is not a dim of `{ir.name}`")
        for name in dims
        if name not in known
    ]
    if not errors:
        env = {**ir.fixed_dims(), **dims}
        errors += [
            Diagnostic(c.span, f"--shape {_dims_text(dims)} violates `{c}`")
            for c in ir.constraints
            if not c.holds(env)
        ]
    if errors:
        raise SpecError(errors, source)
    return {name: dims[name] for name in sorted(dims)}


def list_families() -> int:
    """Print every family, what it matches and the hook points its template offers."""
    for family in FAMILIES:
        print(f"{family.name}: {family.summary}")
        for hook in family.hooks:
            print(f"  hook  {hook}")
    return 0
