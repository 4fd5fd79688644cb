"""ops.py (and backward_reference.py): a generated kernel's torch.library op, with autograd if it has one."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from fusegen.codegen.autodiff import grad_name
from fusegen.codegen.backward import Backward
from fusegen.codegen.files.reference import TORCH_DTYPE, dim_bindings, reference_source
from fusegen.codegen.files.render import header, render
from fusegen.codegen.files.signature import Returned, door_source, op_check, signature
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR, OutputDecl

if TYPE_CHECKING:
    import torch

TEMPLATE = "ops.py.jinja"


def ops_files(ir: KernelIR, back: Backward | None, untrained: str | None) -> dict[str, str]:
    """ops.py, plus backward_reference.py where the op trains (`back`: the build's backward stage, else
    `untrained` says why not); `ir` is the spec's own (unfused) IR. Each backward reads the saved tensors
    its own IR names."""
    if back is None:
        return {"ops.py": ops_source(ir, None, untrained=untrained)}
    kernel_ir = back.kernels.ir if back.kernels is not None else None  # None: no kernels
    ops = ops_source(ir, back.reference, kernel_ir)
    return {"ops.py": ops, "backward_reference.py": reference_source(back.reference)}


def ops_source(
    ir: KernelIR, back: KernelIR | None, kernel_back: KernelIR | None = None, untrained: str | None = None
) -> str:
    """ops.py: the custom op, its fake, and its autograd (back given: the reference's backward IR;
    kernel_back: the backward kernels' IR, where there are kernels) or an inference-only guard saying
    `untrained`, why."""
    # a trainable op returns the saved outputs too, so autograd can keep them for the backward
    outputs = [o for o in ir.outputs if back is not None or not o.optional]
    names = [o.name for o in outputs]
    return render(
        TEMPLATE,
        header=header(ir, TEMPLATE),
        name=ir.name,
        outputs=", ".join(names),
        returns=_returns(len(names)),
        one_output=len(names) == 1,
        save_kw=", save=True" if any(o.optional for o in ir.outputs) else "",
        fake_lines=[f"d_{name} = {src}" for name, src in dim_bindings(ir, str)],
        fake_outs=[_fake_output(ir, o) for o in outputs],
        door_source=door_source([("_SIGNATURE", signature(f"fusegen::{ir.name}", ir, _returned(outputs)))]),
        op_check=op_check("_SIGNATURE", ir),
        trainable=back is not None,
        untrained=untrained,
        backward_kernel=kernel_back is not None,
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
    }


def _returned(outputs: list[OutputDecl]) -> list[Returned]:
    """What the op returns: every output it lists, saved ones included."""
    return [Returned(o.name, o.dtype, o.shape) for o in outputs]


def _fake_output(ir: KernelIR, out: OutputDecl) -> str:
    dims = ", ".join(dim_source(d) for d in out.shape)
    return f"{ir.inputs[0].name}.new_empty(({dims},), dtype={TORCH_DTYPE[out.dtype]})"


def _autograd_context(ir: KernelIR, back: KernelIR | None, kernel_back: KernelIR | None) -> dict[str, object]:
    """Positions the autograd half of the template needs: outputs to mark, save and differentiate, and each
    backward's arguments as positions in (inputs, saved outputs, output gradients)."""
    if back is None:
        return {}
    backs = [b for b in (back, kernel_back) if b is not None]
    read = {d.name for b in backs for d in b.inputs}
    saved = [i for i, o in enumerate(ir.outputs) if o.name in read]
    differentiated = [i for i, o in enumerate(ir.outputs) if not o.optional]
    pool = [d.name for d in ir.inputs] + [ir.outputs[i].name for i in saved]
    pool += [grad_name(ir.outputs[i].name) for i in differentiated]
    params = [p.name for p in ir.params]
    typed = [f"{t}: torch.Tensor" for t in pool] + [f"{p}: float" for p in params]
    context = {
        "n_inputs": len(ir.inputs),
        "backward_signature": ", ".join(typed),
        "backward_fake_signature": ", ".join(pool + params),
        "backward_tensors": ", ".join(pool),
        "backward_returns": _returns(len(ir.inputs)),
        "optional_outputs": _tuple(str(i) for i, o in enumerate(ir.outputs) if o.optional),
        "saved_outputs": _tuple(str(i) for i in saved),
        "differentiated_outputs": _tuple(str(i) for i in differentiated),
        **_arguments("reference", back, pool),
    }
    return context | (_arguments("kernel", kernel_back, pool) if kernel_back is not None else {})


def _returns(n: int) -> str:
    """The return annotation of an op with `n` tensor results."""
    return "torch.Tensor" if n == 1 else f"tuple[{', '.join(['torch.Tensor'] * n)}]"


def _tuple(items: Iterable[str]) -> str:
    """A tuple display of source items: `()`, `(a,)`, `(a, b)`."""
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _arguments(which: str, back: KernelIR, pool: list[str]) -> dict[str, str]:
    """`<which>_args`: a backward's tensor arguments as positions in `pool` (`<which>_names`: their names);
    `<which>_dtypes`: their dtypes, as source text."""
    return {
        f"{which}_args": _tuple(str(pool.index(d.name)) for d in back.inputs),
        f"{which}_names": ", ".join(d.name for d in back.inputs),
        f"{which}_dtypes": _tuple(TORCH_DTYPE[d.dtype] for d in back.inputs),
    }


def load_ops(name_or_path: str | Path, out_dir: str | Path = "generated") -> ModuleType:
    """Import a generated folder's ops.py once per process (importing it registers torch.ops.fusegen.<name>).

    `name_or_path`: a generated folder (any path holding ops.py, from any working directory), or a
    kernel name looked up in `out_dir` (default: generated/ under the working directory)."""
    folder = Path(name_or_path)
    if not (folder / "ops.py").is_file() and len(folder.parts) == 1:  # a name; a path stays as given
        folder = Path(out_dir) / name_or_path
    key = f"_fusegen_ops_{folder.name}"  # one op per kernel name: torch.library refuses a second
    path = folder / "ops.py"
    loaded = sys.modules.get(key)
    if loaded is not None and path.is_file() and Path(loaded.__file__ or "").resolve() != path.resolve():
        raise RuntimeError(  # returning the loaded module would run the other folder's kernel
            f"torch.ops.fusegen.{folder.name} is already registered from {loaded.__file__}; {path} is"
            " another build of that name; a process holds one op per kernel name: load it in a new process"
        )
    if loaded is None:
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


def cached_layouts(
    name_or_path: str | Path, device: str | torch.device = "cpu", out_dir: str | Path = "generated"
) -> AbstractContextManager[object]:
    """A scope in which `torch.ops.fusegen.<name>` on `device` reuses its weights' kernel layouts: the host
    function's `cached_layouts()` (an FFN's; README, "Calling generated code") on the backend those ops run
    on at entry, a no-op where there is none. Loads the op as `load_ops` does."""
    return load_ops(name_or_path, out_dir)._cached_layouts(device)
