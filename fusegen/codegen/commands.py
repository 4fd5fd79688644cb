"""`fusegen build` and `fusegen check`: what the CLI runs, with progress on stderr."""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from fusegen.codegen.build import (
    FAMILIES,
    BuildOptions,
    Built,
    build_spec,
    dim_line,
    plan_shape,
)
from fusegen.codegen.files.tests import test_case, test_shapes
from fusegen.codegen.output import leftovers, stale_files, write_atomically
from fusegen.codegen.range_errors import spec_ranges
from fusegen.codegen.recorded import kernel_folders
from fusegen.dsl import load_spec
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.ir import KernelIR, eval_shape
from fusegen.dsl.names import did_you_mean
from fusegen.dsl.shapes import MAX_DIM_VALUE
from fusegen.jsonout import document, emit, number
from fusegen.testing import TORCH_DTYPES, Report, run_against_reference


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_and_warn(spec: str, options: BuildOptions) -> Built:
    """build_spec, its warnings printed (to stderr, as progress is): for the commands a user runs."""
    built = build_spec(spec, options)
    for warning in built.warnings:
        _progress(warning)
    return built


def build(specs: list[str], options: BuildOptions, check_only: bool = False, every_spec: bool = False,
          fmt: str = "text") -> int:  # fmt: skip
    """Build every spec (all rendered before any is written); with check_only, report stale files.

    every_spec: `specs` are the project's defaults (examples/*.spec and every folder's recorded spec, see
    recorded.default_specs), so a folder no spec builds any more, or whose spec is gone, is stale too."""
    specs = list({Path(spec).resolve(): spec for spec in reversed(specs)}.values())[::-1]  # each file once
    built = []
    for spec in specs:
        _progress(f"fusegen: building {spec}")
        built.append(build_and_warn(spec, options))
    _one_spec_per_kernel(specs, built, options.out_dir)
    orphans = _orphans(options.out_dir, built) if every_spec else []
    if check_only:
        return _report_stale(options.out_dir, built, orphans, fmt)
    for b in built:
        changed = write_atomically(options.out_dir, b.files)
        print(f"{b.name}: {len(b.files)} files in {options.out_dir / b.name}, {len(changed)} changed")
    for folder, why in orphans:
        _progress(f"fusegen: {folder}/ was not rebuilt: {why}; build its spec by name, or delete the folder")
    return 1 if orphans else 0


def _one_spec_per_kernel(specs: list[str], built: list[Built], out_dir: Path) -> None:
    """SpecError when two specs build one kernel name: both would write one folder, the later silently
    replacing the earlier (and `build --check` would call one of them stale forever)."""
    first: dict[str, str] = {}
    for spec, b in zip(specs, built, strict=True):
        earlier = first.setdefault(b.name, spec)
        if earlier != spec:
            source = Path(spec).read_text(encoding="utf-8", errors="replace")
            what = f"kernel `{b.name}` is also built by {earlier}: both would write {out_dir / b.name}/"
            hint = f"give one of them another name: `kernel {b.name}_2`"
            raise SpecError([Diagnostic(_kernel_line(source, spec), what, hint=hint)], source)


def _kernel_line(source: str, path: str) -> Span:
    """The span of the spec's `kernel NAME` line (it parsed, so it has one)."""
    lines = source.removeprefix("\ufeff").split("\n")
    number = next((i for i, line in enumerate(lines, 1) if line.split()[:1] == ["kernel"]), 1)
    return Span(path, number, 1, number, len(lines[number - 1].rstrip()) + 1)


def _report_stale(out_dir: Path, built: list[Built], orphans: list[tuple[Path, str]], fmt: str) -> int:
    """Print every stale file, every leftover of a killed build and every orphan folder (text or JSON);
    1 if there is any."""
    stale = [(str(out_dir / rel), _why_stale(out_dir, b, rel)) for b in built
             for rel in stale_files(out_dir, b.name, b.files)]  # fmt: skip
    stale += [(str(p), "left over by an interrupted build") for p in leftovers(out_dir)]
    stale += [(f"{folder}/", why) for folder, why in orphans]
    if fmt == "json":
        files = [{"path": path, "reason": why} for path, why in stale]
        emit(document("build-check", not stale, kernels=[b.name for b in built], stale=files))
        return 1 if stale else 0
    for path, why in stale:
        print(f"stale: {path}" + ("" if why == "differs" else f" ({why})"))
    if stale:
        print(_stale_summary(out_dir, [path for path, _ in stale], len(orphans)))
    return 1 if stale else 0


def _stale_summary(out_dir: Path, paths: list[str], orphans: int) -> str:
    """The closing line: stale files and folders counted apart (an orphan folder is one entry, not its
    files), and what fixes each."""
    folders = sum(path.endswith("/") or Path(path).is_dir() for path in paths)
    counts = [f"{n} {what}" for n, what in ((len(paths) - folders, "file(s)"), (folders, "folder(s)")) if n]
    fix = "run `fusegen build` and commit the result"
    if orphans:  # a build never deletes a folder whose spec is gone or builds another kernel
        fix += f"; the {orphans} folder(s) no spec builds: build their spec by name, or delete them"
    return f"{' and '.join(counts)} under {out_dir}/ are stale: {fix}"


def _why_stale(out_dir: Path, built: Built, rel: str) -> str:
    """differs / missing / left over (a file an older build wrote that this one does not)."""
    if rel not in dict(built.files):
        return "left over"
    return "differs" if (out_dir / rel).is_file() else "missing"


def _orphans(out_dir: Path, built: list[Built]) -> list[tuple[Path, str]]:
    """Folders in `out_dir` that none of `built` writes, with why."""
    names = {b.name for b in built}
    orphans = []
    for folder in kernel_folders(out_dir):
        if folder.path.name in names:
            continue
        if folder.recorded is None:
            orphans.append((folder.path, "no fusegen header names its spec"))
        elif folder.spec is None:
            orphans.append((folder.path, f"its spec {folder.recorded} is not found"))
        else:
            orphans.append((folder.path, f"its spec {folder.recorded} now builds another kernel"))
    return orphans


def check(specs: list[str], options: BuildOptions, shapes: list[dict[str, int]], fmt: str = "text",
          mode: str = "sim") -> int:  # fmt: skip
    """Build to a temporary directory and run each kernel in `mode` (fusegen/modes.py; the caller checks it
    can run here) against its reference; a summary line (or one JSON document) at the end."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fusegen-check-") as tmp:
        out = Path(tmp)
        for spec in specs:
            ir, _ = load_spec(spec)
            runs = [validated_shape(ir, spec, dims) for dims in shapes] or [env for env, _ in test_shapes(ir)]
            fits_host(ir, spec, runs, given=bool(shapes))
            for dims in shapes:
                plan_shape(
                    spec, dims, options.target, options.lnc
                )  # no plan fits: the planner's message, not a traceback
            built = build_and_warn(spec, BuildOptions(out, options.target, options.lnc))
            write_atomically(out, built.files)
            for dims in runs:
                _progress(f"fusegen: {_doing(mode)} {built.name} at {_dims_text(dims)}{_where(mode)}")
                case = test_case(ir, dims)
                with spec_ranges(spec, dims):
                    report = run_against_reference(
                        out / built.name, built.name, case, options.lnc, options.target, mode
                    )
                if fmt != "json":
                    print(report.text())
                results.append(_run_json(spec, built.name, dims, options, report))
    failed = sum(not r["ok"] for r in results)
    if fmt == "json":
        emit(document("check", not failed, runs=results, failed=failed, mode=mode))
    else:
        verdict = "all ok" if not failed else f"{failed} FAILED"
        where = "" if mode == "sim" else f" ({mode})"
        print(f"check{where}: {len(specs)} spec(s), {len(results)} run(s), {verdict}")
    return 1 if failed else 0


def _run_json(spec: str, name: str, dims: dict[str, int], options: BuildOptions, report: Report
              ) -> dict[str, Any]:  # fmt: skip
    outputs = [
        {"name": o.name, "dtype": str(o.dtype).removeprefix("torch."), "max_error": number(o.max_error),
         "tolerance": o.bound, "ok": o.ok}
        for o in report.outputs
    ]  # fmt: skip
    return {"spec": spec, "kernel": name, "target": options.target, "lnc": options.lnc, "dims": dims,
            "ok": report.ok, "outputs": outputs, "error": report.error}  # fmt: skip


def _doing(mode: str) -> str:
    """The progress verb for a mode."""
    return "compiling" if mode == "compile" else "running"


def _where(mode: str) -> str:
    """Where a mode runs, for the progress line."""
    return {"sim": " on the interpreter", "nki-sim": " on nki.simulate", "compile": " (compile only)",
            "device": " on the Neuron device"}[mode]  # fmt: skip


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
    errors += _unknown_dims(ir, dims) + _refixed_dims(ir, dims)
    # as on a `check` line: a run needs every dim >= 1 (a call with a zero dim launches nothing)
    limits = f"a dim must be a positive integer (at most {MAX_DIM_VALUE})"
    errors += [
        Diagnostic(d.span, f"--shape gives {d.name}={dims[d.name]}: {limits}")
        for d in free
        if d.name in dims and not 1 <= dims[d.name] <= MAX_DIM_VALUE
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


def _unknown_dims(ir: KernelIR, dims: dict[str, int]) -> list[Diagnostic]:
    """An error per `--shape` name the spec does not declare, under the whole `dim` line (not one dim's name)
    and naming the dims it does declare."""
    span = dim_line(ir)
    known = [d.name for d in ir.dims]
    listing = f"the dims of `{ir.name}` are {', '.join(known)}"
    errors = []
    for name in dims:
        if name not in known:
            what = f"--shape names `{name}`, which is not a dim of `{ir.name}`"
            fix = did_you_mean(name, known) or "drop it"
            errors.append(Diagnostic(span, what, hint=f"{fix} ({listing})"))
    return errors


def _refixed_dims(ir: KernelIR, dims: dict[str, int]) -> list[Diagnostic]:
    """An error per `--shape` value for a dim the spec fixes to another value (as on a `check` line); it
    reached the host function's argument check, a traceback."""
    errors = []
    for d in ir.dims:
        if d.value is not None and d.name in dims and dims[d.name] != d.value:
            given = f"{d.name}={dims[d.name]}"
            hint = f"drop {given} (a fixed dim needs no value), or change its `dim` line"
            what = f"--shape gives {given}, but the spec fixes `{d.name} = {d.value}`"
            errors.append(Diagnostic(d.span, what, hint=hint))
    return errors


def fits_host(ir: KernelIR, spec: str, runs: list[dict[str, int]], given: bool = False) -> None:
    """SpecError for a run whose inputs and outputs alone outgrow this machine's memory: the interpreter
    holds them all on the host, where the allocation would fail as a traceback. `given`: --shape runs."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    errors = []
    for dims in runs:
        need = _host_bytes(ir, dims)
        if need > memory:
            span = ir.dims[0].span if given or not ir.checks else _nearest_check(ir, dims)
            what = f"{_dims_text(dims)} needs {need / 2**30:,.1f} GiB for its inputs and outputs, more than"
            hint = "the interpreter runs on the host: check a smaller shape"
            errors.append(Diagnostic(span, f"{what} this machine's {memory / 2**30:,.1f} GiB", hint=hint))
    if errors:
        raise SpecError(errors, Path(spec).read_text(encoding="utf-8", errors="replace"))


def _host_bytes(ir: KernelIR, dims: dict[str, int]) -> int:
    """Bytes of a run's inputs and outputs in their dtypes."""
    env = {**ir.fixed_dims(), **dims}
    shapes = [(eval_shape(v.shape, env), v.dtype) for v in ir.inputs] + [
        (eval_shape(o.shape, env), o.dtype) for o in ir.outputs
    ]
    return sum(math.prod(shape) * TORCH_DTYPES[dtype].itemsize for shape, dtype in shapes)


def _nearest_check(ir: KernelIR, dims: dict[str, int]) -> Span:
    """The check line a run is (a ragged variant is the smallest check with one dim moved by one)."""
    return min(ir.checks, key=lambda c: sum(abs(c.env().get(k, 0) - v) for k, v in dims.items())).span


def list_families() -> int:
    """Print every family, what it matches and the hook points its template offers."""
    for family in FAMILIES:
        print(f"{family.name}: {family.summary}")
        for hook in family.hooks:
            print(f"  hook  {hook}")
    return 0
