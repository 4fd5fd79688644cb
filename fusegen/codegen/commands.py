"""`fusegen build` and `fusegen check`: what the CLI runs, with progress on stderr."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from fusegen.codegen.build import BuildOptions, build_spec, stale_files, test_shapes, write_atomically
from fusegen.dsl import load_spec


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(specs: list[str], options: BuildOptions, check_only: bool = False) -> int:
    """Build every spec (all rendered before any is written); with check_only, report stale files."""
    built = []
    for spec in specs:
        _progress(f"fusegen: building {spec}")
        built.append(build_spec(spec, options))
    if check_only:
        stale = [rel for b in built for rel in stale_files(options.out_dir, b)]
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
    from fusegen.codegen.build import _is_free
    from fusegen.testing import run_against_reference

    failures = 0
    with tempfile.TemporaryDirectory(prefix="fusegen-check-") as tmp:
        out = Path(tmp)
        for spec in specs:
            built = build_spec(spec, BuildOptions(out, options.target, options.lnc))
            write_atomically(out, built.files)
            ir, _ = load_spec(spec)
            runs = shapes or [env for env, _ in test_shapes(ir)]
            for dims in runs:
                _progress(f"fusegen: running {built.name} at {' '.join(f'{k}={v}' for k, v in dims.items())}")
                module = _test_module(out / built.name, built.name)
                env = {k: v for k, v in dims.items() if _is_free(ir, k)}
                report = run_against_reference(out / built.name, built.name, module.INPUTS,
                                               module.input_shapes(env), lnc=options.lnc, target=options.target)
                print(report.text())
                failures += not report.ok
    return 1 if failures else 0


def _test_module(directory: Path, name: str):  # type: ignore[no-untyped-def]
    from fusegen.testing import load_reference

    return load_reference(directory / f"test_{name}.py")
