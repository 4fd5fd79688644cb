"""Every generated kernel stays inside the documented NKI: a static scan of generated/ (AST, no regex).

Caught here even before the interpreter's strict mode sees a kernel run: division as an ALU op, generators,
GpSimd given an instruction or op the documented table does not list for it (fusegen/codegen/engines.py),
activation functions outside the table, a DMA transpose of a dtype that is not 2 bytes wide, and
non-fp32 tensor_scalar operands / activation scales. Each rule has a breaking snippet below, so a scan
that stopped looking would fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.codegen.build import BuildOptions, build_spec
from fusegen.codegen.engines import ACTIVATION_FUNCTIONS, DMA_TRANSPOSE_BYTES, GPSIMD_OPS, NOT_INSTRUCTIONS
from fusegen.codegen.plan import PlanError
from fusegen.codegen.select_tables import ACTIVATIONS
from fusegen.dsl import load_spec
from fusegen.dsl.diagnostics import SpecError
from fusegen.dsl.ir import DTYPE_BYTES
from fusegen.sim import load_module
from fusegen.testing import Case, run_against_reference

ROOT = Path(__file__).resolve().parents[2]
KERNEL_FILES = sorted(p for p in (ROOT / "generated").glob("*/*kernel.py"))
NL_BYTES = {"nl.bfloat16": 2, "nl.float16": 2, "nl.float32": 4, "nl.int32": 4, "nl.int8": 1}
ALU_KEYWORDS = ("op", "op0", "op1")
#: operands that must be fp32 ([ISA] tensor_scalar, activation)
FP32_OPERANDS = {
    "tensor_scalar": ("operand0", "operand1"),
    "activation": ("scale",),
    "activation_reduce": ("scale",),
}


def source_of(node: ast.AST) -> str:
    return ast.unparse(node)


def traced(tree: ast.Module) -> list[ast.AST]:
    """What NKI traces: the @nki.jit kernels and the module-level functions they call, transitively (the
    host functions and the vendored planner are plain Python); a snippet without functions is all traced."""
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    todo = [f for f in functions.values() if any("nki.jit" in source_of(d) for d in f.decorator_list)]
    if not functions:
        return [tree]
    seen: dict[str, ast.FunctionDef] = {}
    while todo:
        f = todo.pop()
        seen[f.name] = f
        called = {source_of(c.func) for c in ast.walk(f) if isinstance(c, ast.Call)}
        todo += [functions[n] for n in called if n in functions and n not in seen]
    return list(seen.values()) or [tree]


def violations(source: str, hbm_dtypes: dict[str, int] | None = None) -> list[str]:
    """Each construct outside the documented subset in a kernel file's traced code, as `line: what`."""
    tree = ast.parse(source)
    tile_bytes = {**(hbm_dtypes or {}), **_allocated_bytes(tree)}
    found = []
    for node in (n for root in traced(tree) for n in ast.walk(root)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Yield | ast.YieldFrom | ast.GeneratorExp):
            found.append(f"{line}: a generator (NKI traces no generators)")
        if isinstance(node, ast.Attribute) and source_of(node) in NOT_INSTRUCTIONS:
            found.append(f"{line}: {source_of(node)} is not a hardware instruction")
        if isinstance(node, ast.Call) and source_of(node.func).startswith("nisa."):
            found += [f"{line}: {v}" for v in _call_violations(node, tile_bytes)]
    return found


def _call_violations(call: ast.Call, tile_bytes: dict[str, int]) -> list[str]:
    name = source_of(call.func).removeprefix("nisa.")
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    found = []
    ops = tuple(source_of(kw[k]) for k in ALU_KEYWORDS if k in kw and name != "activation") or ("",)
    if "engine" in kw and source_of(kw["engine"]) == "nisa.engine.gpsimd":
        allowed = GPSIMD_OPS.get(name, frozenset())
        if not all(op in allowed for op in ops):
            found.append(f"{name}({', '.join(ops)}) on GpSimd, which the documented table does not allow")
    if name in ("activation", "activation_reduce") and source_of(kw["op"]) not in ACTIVATION_FUNCTIONS:
        found.append(f"activation function {source_of(kw['op'])} is not in the activation table")
    if name == "dma_transpose":
        size = tile_bytes.get(_base(kw["src"]))
        if size is not None and size not in DMA_TRANSPOSE_BYTES:
            found.append(f"dma_transpose of a {size}-byte dtype (DMA transposes take 2-byte dtypes)")
    for key in FP32_OPERANDS.get(name, ()):
        size = tile_bytes.get(_base(kw[key])) if key in kw else None
        if size is not None and size != 4:
            found.append(f"{name} {key} is a {size}-byte tile; it must be fp32")
    return found


def _base(node: ast.AST) -> str:
    """The tensor a (sliced, indexed) access reads: `x_hbm` of `x_hbm[t0:t0 + pt, h]`."""
    while isinstance(node, ast.Subscript | ast.Call):
        node = node.value if isinstance(node, ast.Subscript) else node.func
        if isinstance(node, ast.Attribute):  # x.ap(...), x.reshape(...)
            node = node.value
    return source_of(node)


def _allocated_bytes(tree: ast.AST) -> dict[str, int]:
    """Element size of every `name = nl.ndarray(..., dtype=nl.X, ...)` in the file."""
    sizes = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            kw = {k.arg: source_of(k.value) for k in node.value.keywords}
            if source_of(node.value.func) == "nl.ndarray" and kw.get("dtype") in NL_BYTES:
                sizes |= {source_of(t): NL_BYTES[kw["dtype"]] for t in node.targets}
    return sizes


def _hbm_bytes(kernel: Path) -> dict[str, int]:
    """Element size of each kernel input, from the spec the file's header names."""
    spec = re.search(r"from (\S+\.spec) ", kernel.read_text().splitlines()[0])
    assert spec, f"{kernel}: no spec in the provenance header"
    ir, _ = load_spec(str(ROOT / spec.group(1)))
    return {f"{i.name}_hbm": DTYPE_BYTES[i.dtype] for i in ir.inputs}


@pytest.mark.parametrize("kernel", KERNEL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generated_kernel_is_inside_the_documented_subset(kernel: Path) -> None:
    assert violations(kernel.read_text(), _hbm_bytes(kernel)) == []


def test_every_kernel_file_is_scanned() -> None:
    backward = [p for p in KERNEL_FILES if p.name == "backward_kernel.py"]
    assert len(KERNEL_FILES) >= 19 and len(backward) >= 3


BREAKING = {
    "nl.divide": "nisa.tensor_scalar(dst=a[0:1, 0:1], data=b[0:1, 0:1], op0=nl.divide, operand0=2.0)",
    "generator": "@nki.jit\ndef kernel():\n    steps = head()\n\ndef head():\n    yield",
    "generator expression": "xs = list(t for t in range(3))",
    "GpSimd maximum": "nisa.tensor_tensor(dst=a, data1=b, data2=c, op=nl.maximum, engine=nisa.engine.gpsimd)",
    "GpSimd tensor_scalar": "nisa.tensor_scalar(dst=a, data=b, op0=nl.multiply, operand0=2.0, "
    "engine=nisa.engine.gpsimd)",
    "GpSimd scalar_tensor_tensor": "nisa.scalar_tensor_tensor(dst=a, data=b, op0=nl.multiply, operand0=2.0, "
    "op1=nl.add, operand1=c, engine=nisa.engine.gpsimd)",
    "activation outside the table": "nisa.activation(dst=a, op=nl.cos, data=b)",
    "f32 dma_transpose": "t = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)\n"
    "nisa.dma_transpose(dst=u[0:16, 0:16], src=t[0:16, 0:16])",
    "f32 dma_transpose from HBM": "nisa.dma_transpose(dst=u[0:16, 0:16], src=x_hbm[0:16, 0:16])",
    "bf16 tensor_scalar operand": "c = nl.ndarray((128, 1), dtype=nl.bfloat16, buffer=nl.sbuf)\n"
    "nisa.tensor_scalar(dst=a, data=b, op0=nl.multiply, operand0=c[0:128, 0:1])",
    "bf16 activation scale": "c = nl.ndarray((128, 1), dtype=nl.bfloat16, buffer=nl.sbuf)\n"
    "nisa.activation(dst=a, op=nl.exp, data=b, scale=c[0:128, 0:1])",
}


@pytest.mark.parametrize("snippet", BREAKING.values(), ids=BREAKING.keys())
def test_the_scan_rejects_each_construct(snippet: str) -> None:
    assert len(violations(snippet, {"x_hbm": 4})) == 1


def test_the_scan_accepts_the_legal_forms() -> None:
    legal = (
        "nisa.tensor_tensor(dst=a, data1=b, data2=c, op=nl.add, engine=nisa.engine.gpsimd)\n"
        "nisa.tensor_copy(dst=a, src=b, engine=nisa.engine.gpsimd)\n"
        "nisa.memset(dst=a, value=0.5, engine=nisa.engine.gpsimd)\n"
        "nisa.reciprocal(dst=a, data=b)\n"
        "nisa.dma_transpose(dst=u[0:16, 0:16], src=x_hbm[0:16, 0:16])\n"
        "held = [h for h in range(4)]\n"
    )
    assert violations(legal, {"x_hbm": 2}) == []


def test_codegen_names_only_table_activations() -> None:
    assert set(ACTIVATIONS.values()) <= ACTIVATION_FUNCTIONS


F32_FFN = """kernel f32_ffn
dim R, K, I
require K % 128 == 0
input x: f32[R, K]
input w1t: f32[K, I]
input wgt: f32[K, I]
input w2t: f32[I, K]
input gamma: f32[K]
param eps = 1e-6
output out: f32[R, K]
xn = f32(rmsnorm(x, eps, gamma))
out = (silu(xn @ w1t) * (xn @ wgt)) @ w2t / 4.0
check R=130 K=256 I=200
"""


@pytest.fixture(scope="module")
def f32_ffn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An FFN over fp32 x (plain and pre-normed projections), built into a temporary folder."""
    out = tmp_path_factory.mktemp("f32")
    spec = out / "f32_ffn.spec"
    spec.write_text(F32_FFN)
    built = build_spec(str(spec), BuildOptions(out_dir=out))
    for name, text in built.files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out / "f32_ffn"


def test_f32_ffn_transposes_on_the_pe(f32_ffn: Path) -> None:
    source = (f32_ffn / "kernel.py").read_text()
    assert "dma_transpose" not in source and "nisa.nc_transpose(" in source
    assert violations(source, {"x_hbm": 4}) == []


@pytest.mark.parametrize(("r", "target", "lnc"), [(130, "trn2", 2), (7, "trn1", 1)])
def test_f32_ffn_matches_formula(f32_ffn: Path, r: int, target: str, lnc: int) -> None:
    gen = torch.Generator().manual_seed(r)
    k, i = 256, 200
    x = torch.randn(r, k, generator=gen)
    w1t, wgt = (torch.randn(k, i, generator=gen) * k**-0.5 for _ in range(2))
    w2t, gamma = torch.randn(i, k, generator=gen) * i**-0.5, torch.rand(k, generator=gen) + 0.5
    module = load_module(f32_ffn / "kernel.py", target=target)
    out = module.f32_ffn(x, w1t, wgt, w2t, gamma, lnc=lnc, target=target)
    xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    want = (F.silu(xn.double() @ w1t.double()) * (xn.double() @ wgt.double())) @ w2t.double() / 4.0
    assert (out.double() - want).abs().max().item() <= 1e-5 * want.abs().max().item() + 1e-6


def test_trn1_builds_test_lnc_one_only(tmp_path: Path) -> None:
    built = build_spec(str(ROOT / "examples" / "add_rmsnorm.spec"), BuildOptions(tmp_path, "trn1", 1))
    test = dict(built.files)["add_rmsnorm/test_add_rmsnorm.py"]
    assert '@pytest.mark.parametrize("lnc", [1])' in test


def test_lnc2_on_trn1_is_refused(f32_ffn: Path) -> None:
    case = Case((("x", "f32", "1"),), (), {"R": 1}, {"x": (1, 128)})
    with pytest.raises(PlanError, match="trn1 runs LNC=1 only"):
        run_against_reference(f32_ffn, "f32_ffn", case, lnc=2, target="trn1")
    with pytest.raises(SpecError, match="trn1 runs LNC=1 only"):
        build_spec(str(ROOT / "examples" / "add_rmsnorm.spec"), BuildOptions(Path("unused"), "trn1", 2))


POW_DIV = """kernel powdiv
dim T, H
input x: f32[T, H]
param c = 0.5
output y: f32[T, H]
output r: f32[T, 1]
s = sum(x * x, axis=-1, keepdim=true)
y = (x * x + 1.0) ** 1.5 / (s + 1.0) + 2.0 / (x * x + 1.0)
r = maximum(max(x, axis=-1, keepdim=true), c) ** 3 / s + s ** -2
check T=130 H=256
"""


def test_division_powers_and_column_max_are_legal_and_exact(tmp_path: Path) -> None:
    """Division by a tile, a column and a scalar; a non-integer, a cubed and a negative power; a column
    maximum with a param: reciprocal / nl.power on GpSimd / products / relu, against torch."""
    spec = tmp_path / "powdiv.spec"
    spec.write_text(POW_DIV)
    built = dict(build_spec(str(spec), BuildOptions(out_dir=tmp_path)).files)
    source = built["powdiv/kernel.py"]
    assert violations(source, {"x_hbm": 4}) == []
    assert "nisa.reciprocal(" in source and "op=nl.power, engine=nisa.engine.gpsimd" in source
    assert "op=nl.relu" in source  # a column max(m, c) as relu(m - c) + c
    (tmp_path / "kernel.py").write_text(source)
    module = load_module(tmp_path / "kernel.py", target="trn2")
    x = torch.randn(130, 256, generator=torch.Generator().manual_seed(3))
    y, r = module.powdiv(x, c=0.5, lnc=2, target="trn2")
    xd = x.double()
    s = (xd * xd).sum(-1, keepdim=True)
    want_y = (xd * xd + 1) ** 1.5 / (s + 1) + 2 / (xd * xd + 1)
    want_r = torch.clamp(xd.max(-1, keepdim=True).values, min=0.5) ** 3 / s + s**-2
    assert (y.double() - want_y).abs().max().item() <= 1e-6 * want_y.abs().max().item()
    assert (r.double() - want_r).abs().max().item() <= 1e-6 * want_r.abs().max().item()
