"""Property benchmark: generated and mutated specs never give a traceback, a hang, or files that do not load.

Specs come from a grammar-aware generator biased towards what the families accept (row-wise math over
[T, H] data, FFN blocks with epilogues) and from token/line mutations of examples/*.spec. Each spec goes
through `fusegen check-spec` and, when accepted, `fusegen build`; built kernel.py and reference.py are
imported (kernel.py under the interpreter), the other files compiled and the reference run at the
smallest check shape; with --run, every Nth built kernel also runs there against its reference. Reports
specs/s, tracebacks (must be 0) and cases over 5 s.

Run: .venv/bin/python bench/fuzz.py [--count 10000] [--seed 0] [--run 50]
With --oracle N, N cases instead run against an oracle independent of fusegen (bench/oracle_fuzz.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
SLOW_S = 5.0
HANG_S = 60
TOKENS = re.compile(r"\s+|\w+|\*\*|[<>=!]=|.", re.DOTALL)
UNARY = ("exp", "silu", "gelu", "relu", "sigmoid", "tanh", "sqrt", "rsqrt", "log", "abs", "square")
EDGE_NUMBERS = ("0", "1", "2", "127", "128", "129", "1e-400", "1e400", "9" * 19, "0.5", "1e-6", "65536")


@dataclass
class Tally:
    """What a run found."""

    specs: int = 0
    accepted: int = 0
    built: int = 0
    ran: int = 0
    wrong: list[str] = field(default_factory=list)  # specs whose kernel disagreed with the reference
    tracebacks: list[tuple[str, str]] = field(default_factory=list)  # (kind, spec text)
    slow: list[tuple[float, str]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)


# ---- generation ---------------------------------------------------------------------------------------


def _rows_spec(rng: random.Random) -> str:
    """A row-wise spec over [T, H] data: elementwise math, norms, reductions, one or two outputs."""
    dt = lambda: rng.choice(["bf16", "f32", "f32", "f16"])  # noqa: E731
    lines = ["kernel k", "dim T, H", "require H % 128 == 0"]
    values = ["x"] + (["r"] if rng.random() < 0.6 else [])
    lines += [f"input {v}: {dt()}[T, H]" for v in values]
    vectors = ["w"] if rng.random() < 0.7 else []
    lines += [f"input {v}: f32[H]" for v in vectors]
    lines.append("param eps = 1e-6")
    body = []
    for i in range(rng.randint(1, 6)):
        a, b = rng.choice(values), rng.choice(values + vectors + ["2.0", "eps"])
        form = rng.choice([
            f"{a} + {b}", f"{a} * {b}", f"{a} - {b}", f"{rng.choice(UNARY)}({a})", f"rmsnorm({a}, eps)",
            f"rmsnorm({a}, eps, {rng.choice(vectors or ['x'])})", f"layernorm({a}, eps)", f"bf16({a})",
            f"{a} / sum({a}, axis=-1, keepdim=true)", f"{a} * sigmoid({b})", f"clamp({a}, min=-1.0)",
            f"{a} - max({a}, axis=-1, keepdim=true)", f"mean({a}, axis=-1)", f"{a} ** 2",
        ])  # fmt: skip
        body.append(f"v{i} = {form}")
        values.append(f"v{i}")
    outs = rng.sample(values[-3:], k=min(len(values), rng.randint(1, 2)))
    lines += [f"output o{j}: {dt()}[T, H]" for j in range(len(outs))]
    lines += body + [f"o{j} = {dt()}({v})" for j, v in enumerate(outs)]
    lines += [f"check T={rng.choice([1, 4, 7, 128, 300])} H={rng.choice([128, 256, 1280])}"]
    return _width(rng, "\n".join(lines) + "\n")


#: The width axis as written: a whole dim, or compound (solved for H; `H + E` determines neither).
WIDTHS = ("H",) * 6 + ("2*H", "H + 128", "H + E")


def _width(rng: random.Random, text: str) -> str:
    """`text` with its [T, H] / [H] width axis written as one of WIDTHS."""
    width = rng.choice(WIDTHS)
    if width == "H":
        return text
    text = text.replace("[T, H]", f"[T, {width}]").replace("[H]", f"[{width}]")
    return text.replace("dim T, H", "dim T, H, E").replace(" H=", " E=128 H=") if "E" in width else text


#: Epilogues reading a returned value again: the residual sum `s`, or the down-projection `d` itself.
SHARED_TAILS = {
    "s": ("rmsnorm(s, eps)", "s * g", "rmsnorm(s + a, eps)", "layernorm(s, eps) + s"),
    "d": ("d + g", "d + a", "rmsnorm(d + a + a, eps)", "layernorm(d, eps, g) + a"),
}


def _ffn_spec(rng: random.Random) -> str:
    """An FFN block: one or two projections, an activation, a down-projection and an epilogue."""
    act = rng.choice(["silu", "gelu", "relu", "sigmoid"])
    lines = ["kernel k", "dim R, K, I", "require K % 128 == 0", "input x: bf16[R, K]",
             "input w1t: bf16[K, I]", "input w2t: bf16[I, K]"]  # fmt: skip
    up = f"{act}(x @ w1t)"
    if rng.random() < 0.5:
        lines += ["input wgt: bf16[K, I]"]
        up = f"{act}(x @ wgt) * (x @ w1t)"
    lines += ["input a: f32[R, K]", "input g: f32[K]", "param eps = 1e-6", "output y: bf16[R, K]"]
    body = [f"h = {up}", "d = bf16(h) @ w2t"]
    tail = rng.choice(["d", "d + a", "rmsnorm(d + a, eps, g)", "layernorm(d, eps) * g", "d * g + a"])
    if rng.random() < 0.3:  # outputs that share structure: a value both returned and read again
        shared = rng.choice(["s", "d"])
        lines.append(f"output {shared}: f32[R, K]")
        body += ["s = d + a"] if shared == "s" else []
        tail = rng.choice(SHARED_TAILS[shared])
    body.append(f"y = bf16({tail})")
    sizes = (rng.choice([1, 7, 256, 300]), rng.choice([128, 384, 1280]), rng.choice([128, 1000, 3416]))
    return "\n".join(lines + body + ["check R={} K={} I={}".format(*sizes)]) + "\n"


def _mutate(text: str, rng: random.Random, vocabulary: list[str]) -> str:
    """A few token or line edits: delete, insert, swap, duplicate a line, drop a line, an edge number."""
    for _ in range(rng.randint(1, 3)):
        tokens = TOKENS.findall(text)
        at = rng.randrange(len(tokens))
        action = rng.choice(["delete", "insert", "swap", "number", "dupline", "dropline"])
        if action == "delete":
            del tokens[at]
        elif action == "insert":
            tokens.insert(at, rng.choice(vocabulary))
        elif action == "swap":
            other = rng.randrange(len(tokens))
            tokens[at], tokens[other] = tokens[other], tokens[at]
        elif action == "number":
            numbers = [i for i, t in enumerate(tokens) if t[:1].isdigit()] or [at]
            tokens[rng.choice(numbers)] = rng.choice(EDGE_NUMBERS)
        text = "".join(tokens)
        if action in ("dupline", "dropline"):
            lines = text.split("\n")
            line = rng.randrange(len(lines))
            lines[line : line + 1] = [lines[line]] * 2 if action == "dupline" else []
            text = "\n".join(lines)
    return text


def specs(rng: random.Random) -> Iterator[str]:
    """An endless mix: generated family-shaped specs, mutated generated ones and mutated examples."""
    examples = [p.read_text() for p in sorted((ROOT / "examples").glob("*.spec"))]
    vocabulary = sorted({t for s in examples for t in TOKENS.findall(s)} | set(EDGE_NUMBERS))
    while True:
        fresh = _rows_spec(rng) if rng.random() < 0.5 else _ffn_spec(rng)
        roll = rng.random()
        if roll < 0.4:
            yield fresh
        elif roll < 0.6:
            yield _mutate(fresh, rng, vocabulary)
        else:
            yield _mutate(rng.choice(examples), rng, vocabulary)


# ---- running ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Raise TimeoutError after `seconds` (a hang is a finding, not a stuck benchmark)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _cli(args: list[str]) -> tuple[int, str]:
    """Run the fusegen CLI in-process: its exit code and stderr."""
    from fusegen.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(args)
    return code, err.getvalue()


def _load_built(folder: Path, spec: Path, run: bool) -> bool | None:
    """Import kernel.py (under the interpreter) and reference.py, compile the rest, run the reference at the
    smallest check shape; with `run`, the kernel there too: whether it matched (None when not run)."""
    from fusegen.codegen.files.tests import test_case, test_shapes
    from fusegen.dsl import load_spec
    from fusegen.sim import load_module
    from fusegen.testing import compare, load_generated, make_inputs

    for path in folder.glob("*.py"):
        compile(path.read_text(), str(path), "exec")
    kernel = load_module(folder / "kernel.py")
    reference = load_generated(folder / "reference.py")
    ir, _ = load_spec(str(spec))
    dims = min((env for env, _ in test_shapes(ir)), key=lambda env: sorted(env.values()))
    case = test_case(ir, dims)
    args = make_inputs(case.inputs, case.shapes)
    save = {"save": True} if case.save else {}
    want = getattr(reference, f"{ir.name}_reference")(*args, **save)  # cheap: eager torch, every build
    if not run:
        return None
    got = getattr(kernel, ir.name)(*args, **save, lnc=1)
    wants = want if isinstance(want, tuple) else (want,)
    if not all(bool(w.float().isfinite().all()) for w in wants):
        return None  # random inputs outside the math's domain (log of a negative): NaN rules may differ
    return compare(got, want, case.outputs, "fuzz").ok


def one(text: str, work: Path, tally: Tally, run: bool) -> None:
    """Check, build and load one spec, recording what happened."""
    spec = work / "fuzz.spec"
    spec.write_text(text)
    out = work / "out"
    started = time.process_time()  # CPU time: a busy machine must not make a case "slow"
    try:
        with _deadline(HANG_S):
            code, err = _cli(["check-spec", str(spec)])
            _expect(code, err, "check-spec")
            if code == 0:
                tally.accepted += 1
                shutil.rmtree(out, ignore_errors=True)  # only this spec's kernel folder is left to load
                code, err = _cli(["build", "--out", str(out), str(spec)])
                _expect(code, err, "build")
                if code == 0:
                    tally.built += 1
                    (folder,) = out.iterdir()
                    matched = _load_built(folder, spec, run)
                    tally.ran += matched is not None
                    if matched is False:
                        tally.wrong.append(text)
    except Exception as err:  # every escape is a finding
        kind = f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"
        tally.tracebacks.append((kind, text))
        tally.kinds[kind.split(":")[0]] += 1
    elapsed = time.process_time() - started
    if elapsed > SLOW_S:
        tally.slow.append((elapsed, text))


class Internal(Exception):
    """fusegen reported an internal error (exit 3) or printed a traceback."""


def _expect(code: int, err: str, what: str) -> None:
    if code not in (0, 2) or "Traceback" in err:
        last = [line for line in err.splitlines() if line and not line.startswith(" ")][-2:]
        raise Internal(f"{what} exit {code}: {' | '.join(last)[:200]}")


def fuzz(count: int, seed: int, run_every: int = 0, progress: Callable[[str], None] | None = None) -> Tally:
    """Feed `count` specs from `seed` through check-spec, build and load."""
    rng = random.Random(seed)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fusegen-fuzz-") as tmp:
        for text in specs(rng):
            if tally.specs >= count:
                break
            one(text, Path(tmp), tally, run=bool(run_every) and tally.built % run_every == 0)
            tally.specs += 1
            if progress and tally.specs % 500 == 0:
                progress(f"{tally.specs} specs, {len(tally.tracebacks)} tracebacks")
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", type=int, default=50, metavar="N", help="run every Nth built kernel (0: no)")
    parser.add_argument("--save", type=Path, help="write each traceback's spec into this folder")
    parser.add_argument(
        "--oracle",
        type=int,
        default=0,
        metavar="N",
        help="instead: N cases against an oracle independent of fusegen (bench/oracle_fuzz.py)",
    )
    args = parser.parse_args()
    if args.oracle:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import oracle_fuzz

        return oracle_fuzz.main(args.oracle, args.seed)
    started = time.monotonic()
    tally = fuzz(args.count, args.seed, args.run, lambda m: print(m, file=sys.stderr, flush=True))
    elapsed = time.monotonic() - started
    print(f"{tally.specs} specs in {elapsed:.0f} s ({tally.specs / elapsed:.1f} specs/s): "
          f"{tally.accepted} accepted by check-spec, {tally.built} built, {tally.ran} run "
          f"({len(tally.wrong)} wrong), {len(tally.tracebacks)} tracebacks, "
          f"{len(tally.slow)} over {SLOW_S:.0f} s")  # fmt: skip
    for kind, n in tally.kinds.most_common():
        print(f"  {n:5d}  {kind}")
    for i, (kind, text) in enumerate(tally.tracebacks[:20]):
        print(f"--- {kind}\n{text}")
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"tb{i}.spec").write_text(text)
    for text in tally.wrong[:5]:
        print(f"--- kernel differs from its reference\n{text}")
    for elapsed_s, text in sorted(tally.slow, reverse=True)[:3]:
        print(f"--- slow: {elapsed_s:.1f} s\n{text}")
    return 1 if tally.tracebacks or tally.slow or tally.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
