"""Modes (fusegen/modes.py): selection, the reasons a mode cannot run, and each mode's path through the
generated files, with AWS's packages made absent or present through sys.modules (nothing is installed).

AWS's `nki` is played by fusegen's interpreter with its marker cleared (so it counts as installed), and
`torch_neuronx.trace` by a recorder that returns the function it was given (so a "device" run executes
on the interpreter): what is tested is fusegen's plumbing, not AWS's toolchain."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fusegen import modes, sim
from fusegen.cli import main
from fusegen.codegen.files import tests as tests_file
from fusegen.codegen.files.ops import load_ops
from fusegen.dsl import load_spec
from fusegen.testing import make_inputs, run_against_reference

ROOT = Path(__file__).resolve().parents[1]
LAYERNORM = ROOT / "generated" / "layernorm"
SPEC = str(ROOT / "examples" / "layernorm.spec")
SMALL = {"T": 3, "H": 128}
AWS_MODULES = ("nki", "torch_neuronx", "neuronxcc")


@pytest.fixture(autouse=True)
def no_aws_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS's packages absent (a None entry in sys.modules makes find_spec say so) and no device files."""
    for name in AWS_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(modes, "DEVICE_GLOB", str(tmp_path / "neuron*"))
    monkeypatch.delenv(modes.ENV, raising=False)
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    """A stand-in for an installed package."""
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def add_device(tmp_path: Path) -> None:
    (tmp_path / "neuron0").write_text("")


@contextlib.contextmanager
def aws_nki(launches: list[tuple[Any, str | None]]) -> Iterator[types.ModuleType]:
    """The interpreter posing as AWS's nki; its simulate records the launcher and the platform target."""
    with sim.installed(force=True) as nki:
        nki.__fusegen_sim__ = False  # type: ignore[attr-defined]

        def simulate(kernel: Callable[..., Any]) -> Callable[..., Any]:
            launches.append((kernel, os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")))
            return kernel  # the interpreter's launcher runs it

        nki.simulate = simulate  # type: ignore[attr-defined]
        yield nki


def recording_trace(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]],
                    error: Exception | None = None) -> None:  # fmt: skip
    """torch_neuronx (and neuronxcc) present; trace records its arguments and returns `fn`, or raises."""

    def trace(fn: Callable[..., Any], args: tuple[Any, ...], **kwargs: Any) -> Callable[..., Any]:
        calls.append(kwargs | {"target_env": os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")})
        if error is not None:
            raise error
        return fn

    fake_module(monkeypatch, "torch_neuronx", trace=trace)
    fake_module(monkeypatch, "neuronxcc")


def layernorm_inputs(t: int, h: int) -> list[torch.Tensor]:
    """Seeded x (bf16), w and b (f32) of the layernorm example."""
    shapes = {"x": (t, h), "w": (h,), "b": (h,)}
    return make_inputs((("x", "bf16", ""), ("w", "f32", ""), ("b", "f32", "")), shapes)


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch's LayerNorm in fp32 (the spec's eps): the independent formula the kernel's `y` must match."""
    return torch.nn.functional.layer_norm(x.float(), x.shape[-1:], w, b, eps=1e-5)


def test_selected_reads_the_value_then_the_environment_then_defaults_to_sim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert modes.selected() == "sim"
    monkeypatch.setenv(modes.ENV, "compile")
    assert modes.selected() == "compile"
    assert modes.selected("device") == "device"
    monkeypatch.setenv(modes.ENV, "hardware")
    with pytest.raises(modes.ModeError, match=r"unknown mode `hardware` \(from FUSEGEN_MODE\): choose one of "
                                              "sim, nki-sim, compile, device"):  # fmt: skip
        modes.selected()


def test_reasons_name_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert modes.unavailable("sim") is None
    assert "needs nki, which is not installed" in str(modes.unavailable("nki-sim"))
    assert "needs nki, torch-neuronx, neuronx-cc, which are not" in str(modes.unavailable("compile"))
    fake_module(monkeypatch, "nki")  # an nki older than 0.3.0: no simulate
    assert "nki.simulate, which this nki lacks (NKI 0.3.0" in str(modes.unavailable("nki-sim"))
    fake_module(monkeypatch, "nki", simulate=lambda k: k)
    assert modes.unavailable("nki-sim") is None
    assert modes.unavailable("compile") == (
        "mode compile needs torch-neuronx, neuronx-cc, which are not installed here: install the `neuron` "
        "extra from AWS's Neuron package index (docs/hardware.md)"
    )
    recording_trace(monkeypatch, [])
    assert modes.unavailable("compile") is None
    assert "found no Neuron device" in str(modes.unavailable("device"))
    add_device(tmp_path)
    assert modes.unavailable("device") is None


def test_the_interpreters_own_nki_does_not_count_as_installed() -> None:
    with sim.installed(force=True):
        assert "needs nki, which is not installed" in str(modes.unavailable("nki-sim"))


def test_skip_reasons_for_ops_and_for_a_device_lnc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert modes.skip_reason("sim", op=True) is None
    assert "the op's torch checks run on CPU tensors" in str(modes.skip_reason("compile", op=True))
    fake_module(monkeypatch, "nki", simulate=lambda k: k)
    recording_trace(monkeypatch, [])
    add_device(tmp_path)
    assert modes.skip_reason("device", "trn2", 2) is None  # trn2's runtime default is LNC=2
    assert modes.skip_reason("device", "trn2", 1) == (
        "the Neuron runtime here runs LNC=2 (NEURON_LOGICAL_NC_CONFIG); set NEURON_LOGICAL_NC_CONFIG=1 to "
        "run the LNC=1 launch"
    )
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert modes.skip_reason("device", "trn2", 1) is None


def test_jit_kernels_finds_the_decorated_kernels() -> None:
    source = (ROOT / "generated" / "engram_gate" / "kernel.py").read_text()
    assert modes.jit_kernels(source) == ["_fused_weight_kernel", "engram_gate_kernel"]


def test_nki_sim_launches_every_kernel_through_nki_simulate_for_the_target() -> None:
    launches: list[tuple[Any, str | None]] = []
    dims = {"T": 130, "H": 256}
    with aws_nki(launches):
        kernel = modes.load_kernel(LAYERNORM / "kernel.py", "nki-sim", "trn2")
        args = layernorm_inputs(130, 256)
        y = kernel.layernorm(*args, lnc=2, target="trn2")
        case = tests_file.test_case(load_spec(SPEC)[0], dims)
        report = run_against_reference(LAYERNORM, "layernorm", case, 2, "trn2", "nki-sim")
    assert [target for _, target in launches] == ["trn2", "trn2"]
    assert "NEURON_PLATFORM_TARGET_OVERRIDE" not in os.environ  # restored after each launch
    torch.testing.assert_close(y.float(), layernorm(*args), rtol=2e-2, atol=2e-2)
    assert report.ok and report.label.endswith("nki-sim:"), report.text()


def test_device_mode_traces_with_the_target_and_lnc_and_compares(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[dict[str, Any]] = []
    recording_trace(monkeypatch, calls)
    add_device(tmp_path)
    with aws_nki([]):
        assert main(["check", SPEC, "--shape", "T=3", "H=128", "--mode", "device"]) == 0
    out = capsys.readouterr().out
    assert "y (bfloat16): max|out - ref|" in out
    assert out.splitlines()[-1] == "check (device): 1 spec(s), 1 run(s), all ok"
    args = ["--target", "trn2", "--logical-nc-config", "2"]
    assert calls == [{"compiler_workdir": None, "compiler_args": args, "cpu_backend": False,
                      "target_env": "trn2"}]  # fmt: skip


def test_compile_mode_collects_the_compiler_error_per_kernel(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[dict[str, Any]] = []
    recording_trace(monkeypatch, calls, RuntimeError("neuronx-cc failed\nERROR: the partition dim is 256"))
    with aws_nki([]):
        assert main(["check", SPEC, "--shape", "T=3", "H=128", "--mode", "compile", "--lnc", "1"]) == 1
    out = capsys.readouterr().out
    assert "compile FAILED: RuntimeError: neuronx-cc failed | ERROR: the partition dim is 256" in out
    assert out.splitlines()[-1] == "check (compile): 1 spec(s), 1 run(s), 1 FAILED"
    assert calls[0]["cpu_backend"] is True  # no device needed
    assert calls[0]["compiler_args"] == ["--target", "trn2", "--logical-nc-config", "1"]


def test_compile_mode_passes_when_the_compiler_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recording_trace(monkeypatch, [])
    with aws_nki([]):
        assert main(["check", SPEC, "--shape", "T=3", "H=128", "--mode", "compile", "--target", "trn1"]) == 0
    assert "trn1 lnc=1 compile: compiled" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--mode", "nki-sim"], None, "mode nki-sim needs nki, which is not installed here"),
    ([], "device", "mode device needs nki, torch-neuronx, neuronx-cc"),
    ([], "fast", "unknown mode `fast` (from FUSEGEN_MODE)"),
])  # fmt: skip
def test_check_refuses_a_mode_that_cannot_run_with_exit_2(
    argv: list[str], env: str | None, message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    if env:
        monkeypatch.setenv(modes.ENV, env)
    assert main(["check", SPEC, "--shape", "T=3", "H=128", *argv]) == 2
    assert message in capsys.readouterr().err


def test_ops_follow_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = load_ops(LAYERNORM)
    args = layernorm_inputs(3, 128)
    monkeypatch.setenv(modes.ENV, "nki-sim")
    with pytest.raises(ValueError, match="mode nki-sim needs nki"):
        torch.ops.fusegen.layernorm(*args)
    monkeypatch.setenv(modes.ENV, "compile")
    with pytest.raises(ValueError, match="an op on CPU tensors runs in sim or nki-sim mode"):
        torch.ops.fusegen.layernorm(*args)
    launches: list[tuple[Any, str | None]] = []
    monkeypatch.setenv(modes.ENV, "nki-sim")
    ops._module.cache_clear()
    with aws_nki(launches):
        y = torch.ops.fusegen.layernorm(*args)[0]
    ops._module.cache_clear()
    assert len(launches) == 1
    torch.testing.assert_close(y.float(), layernorm(*args), rtol=2e-2, atol=2e-2)


def test_generated_tests_skip_with_the_reason_under_pytests_option() -> None:
    env = {k: v for k, v in os.environ.items() if k != modes.ENV}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:xdist", "-p", "no:cacheprovider",
         str(LAYERNORM / "test_layernorm.py"), "--fusegen-mode", "device"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the op's torch checks run on CPU tensors (sim, nki-sim); mode device tests the kernel only" in (
        result.stdout
    )
    why = modes.skip_reason("device", "trn2", 2)  # this host's own reason, if it has no device
    assert why is None or why in result.stdout
