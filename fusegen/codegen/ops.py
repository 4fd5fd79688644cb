"""ops.py (and backward_reference.py): a generated kernel's torch.library op, with autograd if it has one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.family import Mismatch
from fusegen.codegen.reference import TORCH_DTYPE, dim_bindings
from fusegen.codegen.render import header, render
from fusegen.codegen.signature import Returned, door_source, op_check, signature
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR, OutputDecl

#: Families whose op trains: the row-reduction family lowers its backward IR into NKI kernels of its own
#: (rowreduce_backward.py); an FFN backward needs weight-gradient GEMMs it has no kernel for yet.
TRAINABLE_FAMILIES = ("rowreduce",)
TEMPLATE = "ops.py.jinja"


def ops_files(ir: KernelIR, family: str, target: str = "trn2", lnc: int = 2) -> dict[str, str]:
    """ops.py, plus backward_reference.py for trainable families and backward_kernel.py (with its plan)
    where the family's matcher carries the backward IR; `ir` is the spec's own (unfused) IR.

    The reference differentiates the spec's own math and the kernels the rewritten forward's, so the two
    derivations check each other; each reads the saved tensors its own backward IR names."""
    if family not in TRAINABLE_FAMILIES:
        return {"ops.py": ops_source(ir, None)}
    back = backward_ir(ir)
    from fusegen.codegen.build import reference_source  # build imports this module
    from fusegen.codegen.rowreduce_backward_render import backward_files, kernel_backward_ir

    kernel_back = kernel_backward_ir(ir)
    try:
        kernels = backward_files(kernel_back, target, lnc)
    except Mismatch:  # e.g. an [H] weight's gradient sums over tokens and heads: torch code only
        kernels = {}
    ops = ops_source(ir, back, kernel_back if kernels else None)
    return {"ops.py": ops, "backward_reference.py": reference_source(back), **kernels}


def ops_source(ir: KernelIR, back: KernelIR | None, kernel_back: KernelIR | None = None) -> str:
    """ops.py: the custom op, its fake, and its autograd (back given: the reference's backward IR;
    kernel_back: the backward kernels' IR, where there are kernels) or an inference-only guard."""
    # a trainable op returns the saved outputs too, so autograd can keep them for the backward
    outputs = [o for o in ir.outputs if back is not None or not o.optional]
    names = [o.name for o in outputs]
    return render(
        TEMPLATE,
        header=header(ir, TEMPLATE),
        name=ir.name,
        outputs=", ".join(names),
        returns="torch.Tensor" if len(names) == 1 else f"tuple[{', '.join(['torch.Tensor'] * len(names))}]",
        one_output=len(names) == 1,
        save_kw=", save=True" if any(o.optional for o in ir.outputs) else "",
        fake_lines=[f"d_{name} = {src}" for name, src in dim_bindings(ir, str)],
        fake_outs=[_fake_output(ir, o) for o in outputs],
        door_source=door_source([("_SIGNATURE", signature(f"fusegen::{ir.name}", ir, _returned(outputs)))]),
        op_check=op_check("_SIGNATURE", ir),
        trainable=back is not None,
        backward_kernel=kernel_back is not None,
        nondiff=", ".join(o.name for o in ir.outputs if o.optional),
        **_signatures(ir),
        **_autograd_context(ir, back, kernel_back),
    )


def _signatures(ir: KernelIR) -> dict[str, str]:
    """The op's argument lists as source text: typed, with defaults, as a params dict."""
    params = [(p.name, repr(p.default)) for p in ir.params]
    tensors = [i.name for i in ir.inputs]
    return {
        "args": ", ".join(tensors),
        "dtypes": "(" + " ".join(f"{TORCH_DTYPE[i.dtype]}," for i in ir.inputs) + ")",
        "signature": ", ".join(
            [f"{t}: torch.Tensor" for t in tensors] + [f"{p}: float = {d}" for p, d in params]
        ),
        "fake_signature": ", ".join(tensors + [f"{p}={d}" for p, d in params]),
        "params_dict": "{" + ", ".join(f'"{p}": {p}' for p, _ in params) + "}",
        "param_names": ", ".join(p for p, _ in params),
        "first_input": tensors[0],
    }


def _returned(outputs: list[OutputDecl]) -> list[Returned]:
    """What the op returns: every output it lists, saved ones included."""
    return [Returned(o.name, o.dtype, o.shape) for o in outputs]


def _fake_output(ir: KernelIR, out: OutputDecl) -> str:
    dims = ", ".join(dim_source(d) for d in out.shape)
    return f"{ir.inputs[0].name}.new_empty(({dims},), dtype={TORCH_DTYPE[out.dtype]})"


def _autograd_context(ir: KernelIR, back: KernelIR | None, kernel_back: KernelIR | None) -> dict[str, str]:
    """Names the autograd half of the template needs: saved outputs (those either backward reads), output
    grads, and each backward's arguments and their dtypes."""
    if back is None:
        return {"saved": "", "grads": "", "nones": ""}
    backs = [b for b in (back, kernel_back) if b is not None]
    read = {d.name for b in backs for d in b.inputs}
    context = {
        "saved": ", ".join(o.name for o in ir.outputs if o.name in read and o.optional),
        "grads": ", ".join(f"grad_{o.name}" for o in ir.outputs),
        "nones": "".join(", None" for _ in ir.params) or ",",
        **_arguments("reference", back),
    }
    return context | (_arguments("kernel", kernel_back) if kernel_back is not None else {})


def _arguments(which: str, back: KernelIR) -> dict[str, str]:
    """`<which>_args`: a backward's tensor arguments; `<which>_dtypes`: their dtypes, as source text."""
    return {
        f"{which}_args": ", ".join(d.name for d in back.inputs),
        f"{which}_dtypes": "(" + " ".join(f"{TORCH_DTYPE[d.dtype]}," for d in back.inputs) + ")",
    }


def load_ops(name_or_path: str | Path, out_dir: str | Path = "generated") -> ModuleType:
    """Import a generated folder's ops.py once per process (importing it registers torch.ops.fusegen.<name>).

    `name_or_path`: a generated folder (any path holding ops.py, from any working directory), or a
    kernel name looked up in `out_dir` (default: generated/ under the working directory)."""
    folder = Path(name_or_path)
    if not (folder / "ops.py").is_file():
        folder = Path(out_dir) / name_or_path
    key = f"_fusegen_ops_{folder.name}"  # one op per kernel name: torch.library refuses a second
    if key not in sys.modules:
        path = folder / "ops.py"
        spec = importlib.util.spec_from_file_location(key, path)
        if not path.is_file() or spec is None or spec.loader is None:
            raise FileNotFoundError(
                f"no {path} (from {Path.cwd()}): run `fusegen build` for `{folder.name}`, "
                "or pass the generated folder's path"
            )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]
