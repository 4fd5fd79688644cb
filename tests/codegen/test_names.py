"""Names cannot collide: any name a spec may declare builds, runs its generated tests and trains.

The adversarial names are every name the generated files define (assigned, def'd, imported, parameters),
each of their `_`-separated prefixes (a spec name plus a generated suffix: `prep0` of `prep0_hbm`), and
Python's builtins and keywords. Those fusegen/dsl/names.py rejects must be rejected for a Python reason or
as one of the few public names generated modules export; every other one is used as a kernel, dim, input,
param, intermediate and output name of specs of both families, many names per spec.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fusegen.codegen.build import BuildOptions, build_spec
from fusegen.codegen.files.ops import load_ops
from fusegen.codegen.output import write_atomically
from fusegen.dsl import names
from fusegen.dsl.declarations import OPS_NAMESPACE_ATTRIBUTES
from fusegen.dsl.diagnostics import SpecError

ROOT = Path(__file__).parents[2]
#: names issue 12 found breaking kernel.py, backward_reference.py or training; in one row spec, the output
#: `out` sits next to inputs `grad_out`, `grad_x` and `x` (the backward's own names once were grad_<name>)
ISSUE_NAMES = ["choose", "ctx", "fn", "prep0", "out", "overlaps", "grad_out", "grad_x", "x", "P", "F_MOV"]
ISSUE_NAMES += ["prefix", "grad_w"]  # prep0: the weight (its prepared copy was once prep0_hbm)
#: module constants generated kernels once defined under these names (now `_LNC`, ...), reserved until then
FORMERLY_RESERVED = ["LNC", "TARGET", "MODEL", "MACHINES", "SBUF_BUDGET"]
#: names per role in one spec: a spec declares 2 (row) or 3 (FFN) dims, a kernel name, and these many more
INPUTS, PARAMS, STEPS = 30, 8, 60


def defined_names(paths: list[Path]) -> set[str]:
    """Every name the files bind: assignments, functions, classes, parameters, imports."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.arg):
                found.add(node.arg)
            elif isinstance(node, ast.alias):
                found.add((node.asname or node.name).split(".")[0])
    return found


@functools.cache  # parsing every generated file takes seconds: once per process, not per test
def adversarial_names() -> frozenset[str]:
    """The generated files' names, their `_`-separated prefixes, Python's builtins and keywords."""
    defined = defined_names(sorted(ROOT.glob("generated/*/*.py")))
    defined |= {n.lstrip("_") for n in defined}  # `_<spec name>` forms: `P` of `_P`, `total` of `_total`
    prefixes = {"_".join(n.split("_")[:i]) for n in defined for i in range(1, n.count("_") + 1)}
    python = set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist)
    every = defined | prefixes | python | set(ISSUE_NAMES) | set(FORMERLY_RESERVED)
    return frozenset(n for n in every if n.isidentifier())  # `_12` leaves `12`: no identifier


@functools.cache
def usable_names() -> tuple[str, ...]:
    """The adversarial names a spec may declare, minus the example kernels' names and the names of the ops
    derived from them (`qk_norm_backward`): those ops are registered in this process, and an op name is
    global."""
    examples = {p.stem for p in ROOT.glob("examples/*.spec")}
    taken = {n for n in adversarial_names() if n in examples or any(n.startswith(f"{e}_") for e in examples)}
    return tuple(sorted(n for n in adversarial_names() if names.name_problem(n) is None and n not in taken))


def test_only_python_and_public_names_are_rejected() -> None:
    rejected = {n for n in adversarial_names() if names.name_problem(n) is not None}
    python = set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist)
    reserved_forms = {n for n in rejected if n.startswith(("_", "d_")) or n.lower().startswith("fusegen")}
    assert rejected - python - reserved_forms <= names.GENERATED_CODE_NAMES | names.SPEC_KEYWORDS
    assert len(usable_names()) > 400  # the generated files' own helpers and locals among them


class Names:
    """Names dealt out in order; once they run out, plain `padN` names fill the last spec."""

    def __init__(self, names_: list[str]) -> None:
        self.left = list(names_)
        self.pads = 0

    def take(self, n: int) -> list[str]:
        """The next `n` names."""
        out, self.left = self.left[:n], self.left[n:]
        for _ in range(n - len(out)):
            out.append(f"pad{self.pads}")
            self.pads += 1
        return out


@functools.cache
def chunks(family: str) -> tuple[list[str], ...]:
    """The usable names, one spec's worth each; the FFN family deals them from a shifted start, so a name
    takes a different role (dim, input, param, ...) in each family."""
    pool = [n for n in usable_names() if n not in ISSUE_NAMES]  # dealt once, as the last row spec's
    per_spec = 6 + INPUTS + PARAMS + STEPS if family == "row" else 9 + INPUTS - 4 + PARAMS + STEPS
    shift = 0 if family == "row" else per_spec // 3
    pool = pool[shift:] + pool[:shift]
    dealt = [pool[i : i + per_spec] for i in range(0, len(pool), per_spec)]
    return (*dealt, ISSUE_NAMES) if family == "row" else tuple(dealt)  # an op's name is global: one `choose`


def op_name(name: str) -> str:
    """`name` as a kernel name: the op namespace's own attributes are taken (a spec error, tested below)."""
    return f"{name}_op" if name in OPS_NAMESPACE_ATTRIBUTES else name


@functools.cache
def row_kernel_names() -> frozenset[str]:
    """The row specs' kernel names: an FFN spec dealt one of them takes another (`fusegen::<name>` is one
    op per process, and a worker may run a row spec and an FFN spec of one name)."""
    return frozenset(op_name(chunk[0]) for chunk in chunks("row"))


def test_a_kernel_named_like_the_op_namespace_attribute_is_a_spec_error(tmp_path: Path) -> None:
    spec = tmp_path / "n.spec"
    spec.write_text(
        "kernel name\ndim T, H\ninput x: f32[T, H]\ny = x * 2.0\noutput y: f32[T, H]\ncheck T=3 H=128\n"
    )
    with pytest.raises(SpecError, match=r"1:8: .*`name` cannot be a kernel name: `torch.ops.fusegen.name`"):
        build_spec(str(spec), BuildOptions(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def row_spec(deal: Names) -> tuple[str, Callable[..., torch.Tensor]]:
    """A trainable [T, H] row-reduction spec (a chain of scaled adds of the inputs, then RMSNorm), and the
    same math as a torch function of its inputs and params (the loss the training step minimises)."""
    kernel, t, h, weight, out, norm = deal.take(6)
    kernel = op_name(kernel)
    ins, params, steps = deal.take(INPUTS), deal.take(PARAMS), deal.take(STEPS)
    values = [0.5 + k / 8 for k in range(PARAMS)]
    lines = [f"kernel {kernel}", f"dim {t}, {h}", f"input {weight}: bf16[{h}]"]
    lines += [f"input {i}: bf16[{t}, {h}]" for i in ins]
    lines += [f"param {p} = {v}" for p, v in zip(params, values, strict=True)]
    lines += [f"output {out}: bf16[{t}, {h}]", f"output {norm}: bf16[{t}, {h}]"]
    value = ins[0]
    for k, step in enumerate(steps):
        lines.append(f"{step} = {value} + {ins[1 + k % (INPUTS - 1)]} * {params[k % PARAMS]}")
        value = step
    lines += [f"{out} = bf16({value})", f"{norm} = rmsnorm({value}, 1e-6, {weight})", f"check {t}=3 {h}=128"]

    def loss(w: torch.Tensor, *xs: torch.Tensor) -> torch.Tensor:
        s = xs[0].float()
        for k in range(STEPS):
            s = s + xs[1 + k % (INPUTS - 1)].float() * values[k % PARAMS]
        y = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-6) * w.float()
        return s.square().mean() + y.square().mean()

    return "\n".join(lines) + "\n", loss


def ffn_spec(deal: Names) -> str:
    """An FFN spec: up projection with bias, a scaled SiLU, down projection, scaled residual adds."""
    kernel, r, k, i, x, w1, b1, w2, out = deal.take(9)
    kernel = op_name(kernel)
    kernel = f"{kernel}_ffn" if kernel in row_kernel_names() else kernel
    ins, params, steps = deal.take(INPUTS - 4), deal.take(PARAMS), deal.take(STEPS)
    lines = [f"kernel {kernel}", f"dim {r}, {k}, {i}", f"input {x}: bf16[{r}, {k}]"]
    lines += [f"input {w1}: bf16[{k}, {i}]", f"input {b1}: f32[{i}]", f"input {w2}: bf16[{i}, {k}]"]
    lines += [f"input {a}: f32[{r}, {k}]" for a in ins]
    lines += [f"param {p} = {0.5 + n / 8}" for n, p in enumerate(params)]
    lines += [f"output {out}: bf16[{r}, {k}]"]
    lines += [f"{steps[0]} = silu({x} @ {w1} + {b1}) * {params[0]}", f"{steps[1]} = bf16({steps[0]}) @ {w2}"]
    value = steps[1]
    for n, step in enumerate(steps[2:]):
        lines.append(f"{step} = {value} + {ins[n % len(ins)]} * {params[1 + n % (PARAMS - 1)]}")
        value = step
    lines += [f"{out} = {value}", f"check {r}=3 {k}=128 {i}=32"]
    return "\n".join(lines) + "\n"


def build(text: str, out: Path) -> Path:
    """Build the spec text into `out`; the kernel's folder."""
    spec = out / "names.spec"
    spec.write_text(text)
    built = build_spec(str(spec), BuildOptions(out / "generated"))
    write_atomically(out / "generated", built.files)
    return out / "generated" / built.name


def run_generated_tests(folder: Path) -> None:
    """The kernel's generated test module (interpreter against reference, opcheck, gradcheck), in-process;
    imported by path (importlib mode): two specs here may name their kernels alike, so two test modules of
    one name can run in one process."""
    args = [str(folder), "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", "--import-mode=importlib"]
    args += ["-p", "no:unraisableexception"]  # its exit runs gc.collect() over this process's heap: ~1.4 s
    assert pytest.main(args) == 0


@pytest.mark.parametrize("chunk", range(len(chunks("row"))))
def test_row_specs_of_adversarial_names_build_run_and_train(chunk: int, tmp_path: Path) -> None:
    text, loss_of = row_spec(Names(chunks("row")[chunk]))
    folder = build(text, tmp_path)
    run_generated_tests(folder)
    load_ops(folder.name, folder.parent)
    gen = torch.Generator().manual_seed(chunk)
    leaves = [torch.randn(128, generator=gen).bfloat16()] + [
        torch.randn(3, 128, generator=gen).bfloat16() for _ in range(INPUTS)
    ]
    leaves = [t.float().requires_grad_(True) for t in leaves]
    outs = getattr(torch.ops.fusegen, folder.name)(*leaves)
    loss = sum(o.float().square().mean() for o in outs)
    got = torch.autograd.grad(loss, leaves)
    want = torch.autograd.grad(loss_of(*leaves), leaves)
    for g, w in zip(got, want, strict=True):  # the op's math in bf16 against the torch formula in f32
        torch.testing.assert_close(g, w, rtol=0.05, atol=0.05 * w.abs().max().item())


@pytest.mark.parametrize("chunk", range(len(chunks("ffn"))))
def test_ffn_specs_of_adversarial_names_build_and_run(chunk: int, tmp_path: Path) -> None:
    run_generated_tests(build(ffn_spec(Names(chunks("ffn")[chunk])), tmp_path))


def test_an_ffn_input_named_like_the_packed_columns_builds_and_runs(tmp_path: Path) -> None:
    """The host packs the [I] vectors into one kernel argument: an input spelled like it (`i_cols`, whose
    argument is `i_cols_hbm`) once gave the kernel two parameters of one name."""
    spec = (ROOT / "examples" / "swiglu_ffn.spec").read_text().replace("w2t", "i_cols")
    lines = [line for line in spec.splitlines() if not line.startswith("check")] + ["check R=7 K=256 I=384"]
    folder = build("\n".join(lines).replace("kernel swiglu_ffn", "kernel packed_names_ffn") + "\n", tmp_path)
    tree = ast.parse((folder / "kernel.py").read_text())
    kernel = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.endswith("_kernel"))
    params = [a.arg for a in kernel.args.args]
    assert "i_cols_hbm" in params and len(params) == len(set(params))
    run_generated_tests(folder)
