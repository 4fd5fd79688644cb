"""engram_gate forward, generated vs hand-scheduled (bench/engram_hand_kernel.py), in the cost model.

The hand-scheduled kernel is an experiment: it measures how close the documented cost model lets a kernel
come to the HBM roofline at the issue's shape (T=4096 HC=4 H=2048, trn2, LNC 2) when every step is placed by
hand, and so how far the generator's schedule is from what the model allows. Both kernels run on the
interpreter; each is checked against an independent float64 formula (share of outputs off by more than half
a bf16 ulp). A few splits of the flexible work between the Vector and Scalar engines are tried.
Run: .venv/bin/python bench/engram_hand.py [--quick]   (--quick: T=512)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusegen import sim  # noqa: E402
from fusegen.perf.analysis import model_launches, tensor_bytes  # noqa: E402
from fusegen.perf.capture import launches  # noqa: E402

TARGET, LNC, HC, H = "trn2", 2, 4, 2048
EPS, CLAMP = 1e-20, 1e-6
#: (512-column evictions on Vector, columns of the x*k*W sum on Vector)
SPLITS = ((1, 1024), (1, 768), (2, 1024))


def inputs(t: int) -> tuple[torch.Tensor, ...]:
    """x, kv, w_h, w_e as a model's activations and RMSNorm weights."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((t, HC, H), generator=gen).bfloat16()
    kv = torch.randn((t, HC + 1, H), generator=gen).bfloat16()
    w_h, w_e = ((1 + 0.1 * torch.randn((HC, H), generator=gen)).bfloat16() for _ in range(2))
    return x, kv, w_h, w_e


def formula(x: torch.Tensor, kv: torch.Tensor, w_h: torch.Tensor, w_e: torch.Tensor) -> torch.Tensor:
    """The Engram gate in float64, written from the spec's math (not from generated code)."""
    heads, width = x.shape[1], x.shape[2]
    xd, k, v = x.double(), kv[:, :heads].double(), kv[:, heads:].double()
    rx = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + EPS)
    rk = torch.rsqrt((k * k).mean(-1, keepdim=True) + EPS)
    s = (xd * rx * w_h.double() * k * rk * w_e.double()).sum(-1, keepdim=True) / width**0.5
    return xd + torch.sigmoid(torch.sign(s) * torch.sqrt(s.abs().clamp_min(CLAMP))) * v


def off_by_half_ulp(out: torch.Tensor, want: torch.Tensor) -> float:
    """Share of outputs further than half a bf16 ulp (of the exact value) from the float64 formula."""
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(1e-30))) - 7)
    return ((out.double() - want).abs() > 0.5 * ulp * 1.0001).double().mean().item()


def run(label: str, call: Callable[[], torch.Tensor], args: tuple[torch.Tensor, ...], module: ModuleType,
        want: torch.Tensor) -> None:  # fmt: skip
    """Model one kernel's launch; print its time, efficiency, engine busy times and accuracy."""
    with launches(module) as found:
        out = call()
    modeled = model_launches(found, TARGET, LNC, tensor_bytes(args) + tensor_bytes(out))
    busy = ", ".join(f"{e} {s.engine_busy_ns(e) / 1e3:,.1f}" for _, s in modeled.schedules for e in
                     ("vector", "scalar", "tensor", "gpsimd", "dma"))  # fmt: skip
    eff = modeled.roof.efficiency(modeled.time_ns)
    print(
        f"| {label} | {modeled.time_ns / 1e3:,.1f} | {eff:.1%} | {busy} | {off_by_half_ulp(out, want):.2e} |"
    )


def main() -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T=512 instead of 4096")
    t = 512 if parser.parse_args().quick else 4096
    args = inputs(t)
    want = formula(*args)
    generated = sim.load_module(ROOT / "generated" / "engram_gate" / "kernel.py", target=TARGET)
    hand = sim.load_module(ROOT / "bench" / "engram_hand_kernel.py", target=TARGET)
    print(f"engram_gate T={t} HC={HC} H={H}, {TARGET}, LNC {LNC}; modelled (fusegen.perf)")
    print("| kernel | modelled us | of the HBM roofline | busy us per core | outputs > 0.5 bf16 ulp off |")
    print("| --- | ---: | ---: | --- | ---: |")
    run("generated", lambda: generated.engram_gate(*args, lnc=LNC, target=TARGET), args, generated, want)
    for evictions, cols in SPLITS:
        label = f"hand: {evictions} of {H // 512} evictions, {cols} of {H} sum columns on Vector"
        kernel = hand.engram_gate_hand[LNC]
        run(label, lambda: kernel(*args, EPS, CLAMP, evictions, cols), args, hand, want)  # noqa: B023
    return 0


if __name__ == "__main__":
    sys.exit(main())
