"""The `fusegen` command line: one subcommand per job; exit codes are documented in docs/cli.md."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fusegen import __version__
from fusegen.dsl.diagnostics import MAX_ERRORS, SpecError
from fusegen.jsonout import FORMATS

if TYPE_CHECKING:
    from fusegen.codegen.build import BuildOptions

#: Exit codes: success, a failure the command found (mismatch, stale files), a usage or spec error, a bug.
OK, FAILED, USAGE, INTERNAL = 0, 1, 2, 3
#: Targets `--target` offers: those with every figure the planner needs (see `fusegen targets`).
TARGETS = ("trn1", "trn2")
DIM_ITEM = re.compile(r"^[A-Za-z_]\w*=")

EXAMPLES = """examples:
  fusegen check-spec examples/*.spec          validate specs, print a typed summary
  fusegen check-spec --dump ir examples/swiglu_ffn.spec
  fusegen build examples/swiglu_ffn_ln.spec   write generated/swiglu_ffn_ln/
  fusegen build                               rebuild every generated folder from its recorded spec
  fusegen build --check                       exit 1 if generated/ is stale
  fusegen check examples/swiglu_ffn.spec --shape R=300 K=384 I=1000
  fusegen list                                the kernel families and their hook points
  fusegen targets                             the targets and their SBUF/PSUM/clock figures
  fusegen explain examples/swiglu_ffn.spec --shape R=2048 K=1280 I=3416 --trace t.json --svg t.svg
  fusegen bench examples/swiglu_ffn.spec --shape R=2048 K=1280 I=3416   on a Neuron device (docs/hardware.md)

exit codes: 0 ok, 1 a check failed or files are stale, 2 usage or spec error, 3 internal error
"""


class UsageError(Exception):
    """The command line asks for something that cannot be done (exit 2)."""


def _check_spec(args: argparse.Namespace) -> int:
    from fusegen.dsl.commands import check_spec

    if args.dump and args.format == "json":
        raise UsageError("--dump prints a stage as text; it does not combine with --format json")
    return check_spec(args.specs, dump=args.dump, fmt=args.format)


def _options(args: argparse.Namespace) -> BuildOptions:
    from fusegen.codegen.build import BuildOptions

    return BuildOptions(out_dir=Path(getattr(args, "out", "generated")), target=args.target, lnc=_lnc(args))


def _lnc(args: argparse.Namespace) -> int:
    """The requested LNC, or the target's default: trn2 pairs cores (LNC=2), trn1 does not. A degree the
    target lacks is a usage error here, once, rather than a plan error repeated at every check line."""
    from fusegen.sim.targets import TARGETS

    if args.lnc and int(args.lnc) > TARGETS[args.target].max_lnc:
        raise UsageError(f"--lnc {args.lnc} needs NeuronCore-v3 core pairs; --target {args.target} runs "
                         "LNC 1 only: drop --lnc, or build for --target trn2")  # fmt: skip
    return int(args.lnc) if args.lnc else (1 if args.target == "trn1" else 2)


def _build(args: argparse.Namespace) -> int:
    from fusegen.codegen.commands import build
    from fusegen.codegen.recorded import default_specs

    if args.format == "json" and not args.check:
        raise UsageError("--format json is for `build --check`; `build` itself prints one line per kernel")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: name a folder to write the kernels into")
    specs, lost = (args.specs, []) if args.specs else default_specs(out)
    if not specs and not lost:  # with only lost folders, build names them (exit 1)
        raise UsageError("no SPEC given, no examples/*.spec here and no generated folders to rebuild")
    if not args.check:
        _check_creatable(out)
    return build(specs, _options(args), check_only=args.check, every_spec=not args.specs, fmt=args.format)


def _check_creatable(out: Path) -> None:
    """A usage error unless `out` is a folder build can write into or create; creates nothing, so a build
    that then fails leaves no empty folder behind."""
    existing = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"cannot create the output folder --out {out}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create the output folder --out {out}: {existing} is not writable")


def _check(args: argparse.Namespace) -> int:
    from fusegen.codegen.commands import check

    specs = args.specs or sorted(str(p) for p in Path("examples").glob("*.spec"))
    if not specs:
        raise UsageError("no SPEC given and no examples/*.spec here")
    return check(specs, _options(args), _shape_args(args.shape), fmt=args.format, mode=_mode(args))


def _mode(args: argparse.Namespace) -> str:
    """`--mode`, else FUSEGEN_MODE, else sim; a mode that cannot run here is a usage error naming why."""
    from fusegen import modes

    try:
        mode = modes.selected(args.mode)
    except modes.ModeError as err:
        raise UsageError(str(err)) from None
    why = modes.skip_reason(mode, args.target, _lnc(args))
    if why:
        raise UsageError(why)
    return mode


def _list(args: argparse.Namespace) -> int:
    from fusegen.codegen.commands import list_families

    return list_families()


def _targets(args: argparse.Namespace) -> int:
    from fusegen.perf.targets import list_targets

    return list_targets(args.format)


def _one_spec(command: str, specs: list[str]) -> None:
    """UsageError unless exactly one SPEC is given; a stray `T 128` is a --shape item missing its `=`."""
    if len(specs) == 1:
        return
    if not specs:
        raise UsageError(f"{command} takes one SPEC, got none")
    stray = [s for s in specs[1:] if re.fullmatch(r"[A-Za-z]\w*|\d+", s)]
    pair = f"{specs[1]}={specs[2]}" if len(specs) > 2 and specs[2].isdigit() else f"{specs[1]}=N"
    hint = f" (--shape items are NAME=INT, e.g. `{pair}`)" if stray and stray == specs[1:] else ""
    raise UsageError(f"{command} takes one SPEC, got {len(specs)}: {' '.join(specs)}{hint}")


def _explain(args: argparse.Namespace) -> int:
    from fusegen.perf.explain import explain

    _one_spec("explain", args.specs)
    shape = _shape_args(args.shape)
    try:
        return explain(args.specs[0], args.target, _lnc(args), shape[0] if shape else None, args.trace,
                       args.svg, fmt=args.format, calibration=args.calibration)  # fmt: skip
    except OSError as err:  # only the files the user named: any other OSError is ours
        if err.filename is None or str(err.filename) not in (args.trace, args.svg):
            raise
        raise UsageError(f"cannot write {err.filename}: {err.strerror}") from None


def _bench(args: argparse.Namespace) -> int:
    from fusegen.bench import bench

    _one_spec("bench", args.specs)
    if args.iters < 1 or args.warmup < 0:
        raise UsageError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    shape = _shape_args(args.shape)
    return bench(args.specs[0], args.target, _lnc(args), shape[0] if shape else None, args.warmup, args.iters,
                 Path(args.calibration) if args.calibration else None, fmt=args.format)  # fmt: skip


def _shape_args(items: list[str] | None) -> list[dict[str, int]]:
    if not items:
        return []
    dims: dict[str, int] = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise UsageError(f"--shape takes NAME=INT items, got `{item}`")
        if name in dims:  # a later value would silently win: one of the two is a typo
            raise UsageError(f"--shape gives {name} twice: {name}={dims[name]} and {item}")
        dims[name] = int(value)
    return [dims]


def _max_errors_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-errors", type=int, default=MAX_ERRORS, metavar="N",
        help=f"report at most N errors per spec, then how many more (default: {MAX_ERRORS})",
    )  # fmt: skip



def _split_shape(args: argparse.Namespace) -> None:
    """`--shape R=3 K=128 my.spec`: argparse gives the spec to --shape; hand back what is not NAME=INT."""
    shape = getattr(args, "shape", None)
    if shape:
        args.specs = [*args.specs, *(item for item in shape if not DIM_ITEM.match(item))]
        args.shape = [item for item in shape if DIM_ITEM.match(item)]


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (default: examples/*.spec)")


def _target_args(p: argparse.ArgumentParser) -> None:
    _max_errors_arg(p)
    p.add_argument("--target", default="trn2", choices=TARGETS, help="hardware to plan for (default: trn2)")
    p.add_argument("--lnc", type=int, choices=(1, 2),
                   help="logical-core degree (default: 2 on trn2, 1 on trn1)")  # fmt: skip


def _format_arg(p: argparse.ArgumentParser, what: str = "results") -> None:
    p.add_argument("--format", default="text", choices=FORMATS,
                   help=f"print {what} as text (default) or as one JSON document (docs/cli.md)")  # fmt: skip


def _mode_arg(p: argparse.ArgumentParser, what: str, choices: tuple[str, ...] | None = None) -> None:
    from fusegen.modes import MODES

    p.add_argument("--mode", choices=choices or MODES,
                   help=f"{what}: {', '.join(choices or MODES)} (default: $FUSEGEN_MODE, else "
                        f"{(choices or MODES)[0]}; docs/hardware.md)")  # fmt: skip


def _shape_arg(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--shape", nargs="+", metavar="DIM=N", help=help_text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusegen",
        description="Compile declarative fused-op specs into NKI kernels, torch references and tests.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fusegen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check-spec", help="validate specs and print a typed summary")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files; `-` reads one spec from stdin")
    p.add_argument("--dump", choices=("ast", "ir"), help="print a front-end stage's output")
    _format_arg(p, "summaries and diagnostics")
    _max_errors_arg(p)
    p.set_defaults(run=_check_spec)

    p = sub.add_parser("build", help="generate kernel.py, reference.py, test_<name>.py and plan.md per spec")
    p.add_argument("specs", nargs="*", metavar="SPEC",
                   help="spec files (default: examples/*.spec and every folder's recorded spec)")  # fmt: skip
    p.add_argument("--out", default="generated", help="output directory (default: generated/)")
    _target_args(p)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming files that differ")
    _format_arg(p, "`--check` results")
    p.set_defaults(run=_build)

    p = sub.add_parser("list", help="print the kernel families and the hook points each offers")
    p.set_defaults(run=_list)

    p = sub.add_parser("targets", help="print each target's SBUF, PSUM, clock and bandwidth figures")
    _format_arg(p, "the figures")
    p.set_defaults(run=_targets)

    p = sub.add_parser("check", help="build to a temporary directory and run the kernels on the interpreter")
    _spec_args(p)
    _target_args(p)
    _shape_arg(p, "run this shape instead of the spec's checks")
    _mode_arg(p, "where the kernels run")
    _format_arg(p)
    p.set_defaults(run=_check)

    p = sub.add_parser("explain", help="model a kernel's time per engine against the roofline, and its plan")
    p.add_argument("specs", nargs="*", metavar="SPEC", help="one spec file")
    _target_args(p)
    _shape_arg(p, "model this shape (default: the first check line)")
    p.add_argument("--trace", metavar="OUT.json", help="write the modelled timeline as Chrome trace JSON")
    p.add_argument("--svg", metavar="OUT.svg", help="draw the SBUF budget and the engine timeline")
    _calibration_arg(p, "read device measurements from this file")
    _format_arg(p, "the report")
    p.set_defaults(run=_explain)

    p = sub.add_parser("bench", help="measure a kernel's latency on a Neuron device beside the modelled time")
    p.add_argument("specs", nargs="*", metavar="SPEC", help="one spec file")
    _target_args(p)
    _shape_arg(p, "measure this shape (default: the first check line)")
    _mode_arg(p, "where to measure", ("device",))
    p.add_argument("--warmup", type=int, default=10, metavar="N", help="untimed calls first (default: 10)")
    p.add_argument("--iters", type=int, default=100, metavar="N", help="timed calls (default: 100)")
    _calibration_arg(p, "append the measurement to this file")
    _format_arg(p, "the figures")
    p.set_defaults(run=_bench)
    return parser


def _calibration_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--calibration", metavar="PATH",
                   help=f"{what} (default: $FUSEGEN_CALIBRATION, else calibration.jsonl in the project "
                        "root)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run one subcommand; usage and spec errors exit 2, internal errors 3, never silently."""
    if hasattr(sys.stdout, "reconfigure"):  # piped output stays in order with the progress on stderr
        sys.stdout.reconfigure(line_buffering=True)
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return USAGE
    _split_shape(args)
    SpecError.max_errors = getattr(args, "max_errors", MAX_ERRORS)
    try:
        return int(args.run(args))
    except UsageError as err:
        print(f"fusegen {args.command}: error: {err}", file=sys.stderr)
        return USAGE
    except SpecError as err:
        print(err.render(), file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fusegen ... | head`: the reader has left; stop quietly, like cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush fails no more
        return 141
    except Exception:  # an internal error: show everything, and say whose fault it is
        traceback.print_exc()
        print("\ninternal error: this is a fusegen bug; please report it with the spec.", file=sys.stderr)
        return INTERNAL


if __name__ == "__main__":
    sys.exit(main())
