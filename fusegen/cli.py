"""The `fusegen` command line: one subcommand per job, spec mistakes answered with exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fusegen import __version__
from fusegen.dsl.diagnostics import MAX_ERRORS, SpecError

if TYPE_CHECKING:
    from fusegen.codegen.build import BuildOptions

EXAMPLES = """examples:
  fusegen check-spec examples/*.spec          validate specs, print a typed summary
  fusegen check-spec --dump ir examples/swiglu_ffn.spec
  fusegen build examples/swiglu_ffn_ln.spec   write generated/swiglu_ffn_ln/
  fusegen build --check examples/*.spec       exit 1 if generated/ is stale
  fusegen check examples/swiglu_ffn.spec --shape R=300 K=384 I=1000
  fusegen list                                 the kernel families and their hook points
  fusegen explain examples/swiglu_ffn.spec --shape R=2048 K=1280 I=3416 --trace t.json --svg t.svg
"""


def _check_spec(args: argparse.Namespace) -> int:
    from fusegen.dsl.commands import check_spec

    return check_spec(args.specs, dump=args.dump)


def _options(args: argparse.Namespace) -> BuildOptions:
    from fusegen.codegen.build import BuildOptions

    return BuildOptions(out_dir=Path(args.out), target=args.target, lnc=_lnc(args))


def _lnc(args: argparse.Namespace) -> int:
    """The requested LNC, or the target's default: trn2 pairs cores (LNC=2), trn1 does not."""
    return int(args.lnc) if args.lnc else (1 if args.target == "trn1" else 2)


def _specs(args: argparse.Namespace) -> list[str]:
    """The specs named, or every spec under examples/ (what `generated/` is built from)."""
    specs = args.specs or sorted(str(p) for p in Path("examples").glob("*.spec"))
    if not specs:
        raise SystemExit("fusegen: no SPEC given and no examples/*.spec here")
    return specs


def _build(args: argparse.Namespace) -> int:
    from fusegen.codegen.commands import build

    return build(_specs(args), _options(args), check_only=args.check, every_spec=not args.specs)


def _check(args: argparse.Namespace) -> int:
    from fusegen.codegen.commands import check

    return check(_specs(args), _options(args), _shape_args(args.shape))


def _list(args: argparse.Namespace) -> int:
    from fusegen.codegen.commands import list_families

    return list_families()


def _explain(args: argparse.Namespace) -> int:
    from fusegen.perf.explain import explain

    shape = _shape_args(args.shape)
    return explain(args.spec, args.target, _lnc(args), shape[0] if shape else None, args.trace, args.svg)


def _shape_args(items: list[str] | None) -> list[dict[str, int]]:
    if not items:
        return []
    dims = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"fusegen: --shape takes NAME=INT items, got `{item}`")
        dims[name] = int(value)
    return [dims]


def _max_errors_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-errors", type=int, default=MAX_ERRORS, metavar="N",
        help=f"report at most N errors per spec, then how many more (default: {MAX_ERRORS})",
    )  # fmt: skip


def _target_args(p: argparse.ArgumentParser) -> None:
    _max_errors_arg(p)
    p.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (default: examples/*.spec)")
    p.add_argument("--out", default="generated", help="output directory (default: generated/)")
    p.add_argument("--target", default="trn2", choices=("trn1", "trn2", "trn3"))
    p.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2),
        help="logical-core degree (default: 2 on trn2 and later, 1 on trn1)",
    )


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
    p.add_argument("specs", nargs="+", metavar="SPEC")
    p.add_argument("--dump", choices=("ast", "ir"), help="print a front-end stage's output")
    _max_errors_arg(p)
    p.set_defaults(run=_check_spec)

    p = sub.add_parser("build", help="generate kernel.py, reference.py, test_<name>.py and plan.md per spec")
    _target_args(p)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming files that differ")
    p.set_defaults(run=_build)

    p = sub.add_parser("list", help="print the kernel families and the hook points each offers")
    p.set_defaults(run=_list)

    p = sub.add_parser("check", help="build to a temporary directory and run the kernels on the interpreter")
    _target_args(p)
    p.add_argument("--shape", nargs="+", metavar="DIM=N", help="run this shape instead of the spec's checks")
    p.set_defaults(run=_check)

    p = sub.add_parser("explain", help="model a kernel's time per engine against the roofline, and its plan")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--target", default="trn2", choices=("trn1", "trn2"))
    p.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2),
        help="logical-core degree (default: 2 on trn2 and later, 1 on trn1)",
    )
    p.add_argument(
        "--shape", nargs="+", metavar="DIM=N", help="model this shape (default: the first check line)"
    )
    p.add_argument(
        "--trace", metavar="OUT.json", help="write the modelled timeline as Chrome trace-event JSON"
    )
    p.add_argument("--svg", metavar="OUT.svg", help="draw the SBUF budget and the engine timeline")
    p.set_defaults(run=_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run one subcommand; spec errors exit 2 without a traceback."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    SpecError.max_errors = getattr(args, "max_errors", MAX_ERRORS)
    try:
        return int(args.run(args))
    except SpecError as err:
        print(err.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fusegen ... | head`: the reader has left; stop quietly, like cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush fails no more
        return 141
    except Exception:  # an internal error: show everything, and say whose fault it is
        traceback.print_exc()
        print("\ninternal error: this is a fusegen bug; please report it with the spec.", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
