"""installed(), load_module() and launch plumbing."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim import targets

KERNEL_SOURCE = textwrap.dedent("""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    PMAX = nl.tile_size.pmax
    VERSION = nisa.get_nc_version()

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        sb = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x)
        nisa.tensor_scalar(dst=sb, data=sb, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=sb)
        return out

    @nki.jit(platform_target="trn2")
    def ids(x):
        out = nl.ndarray((nl.num_programs(), 1), dtype=nl.int32, buffer=nl.shared_hbm)
        sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=sb, value=nl.program_id(0))
        nisa.dma_copy(dst=out[nl.program_id(0):nl.program_id(0) + 1, 0:1], src=sb)
        return out
""")


@pytest.fixture
def kernel_file(tmp_path):
    path = tmp_path / "my_kernel.py"
    path.write_text(KERNEL_SOURCE)
    return path


def _nki_modules():
    return {k: v for k, v in sys.modules.items() if k == "nki" or k.startswith("nki.")}


def test_installed_binds_and_restores_sys_modules():
    before = _nki_modules()
    with sim.installed() as nki_module:
        import nki
        import nki.isa
        import nki.language

        assert nki is nki_module and nki.isa is sys.modules["nki.isa"]
    assert _nki_modules() == before


def test_load_module_kernels_stay_runnable_after_the_block(kernel_file):
    module = sim.load_module(kernel_file, target="trn1")
    assert "nki" not in sys.modules
    assert module.PMAX == 128 and module.VERSION.name == "gen2"
    x = torch.randn(128, 16).bfloat16()
    assert torch.equal(module.double(x), (x.float() * 2).bfloat16())
    assert module.double.last_run.stats["target"] == "trn1"
    with pytest.raises(sim.SimError, match=r"\[lnc-target\]"):  # trn1 has no LNC=2
        module.ids[2](x)
    assert sim.run(module.ids, x, grid=(2,), target="trn2").outputs.tolist() == [[0], [1]]


def test_a_real_nki_is_not_shadowed_unless_forced(tmp_path, monkeypatch, kernel_file):
    fake = tmp_path / "site" / "nki"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(sim.SimError, match="force=True"), sim.installed():
        pass
    module = sim.load_module(kernel_file, force=True)
    assert torch.equal(module.double(torch.ones(2, 2)), torch.full((2, 2), 2.0))
    assert "nki" not in sys.modules


def test_targets_table():
    assert targets.TARGETS["trn2"].sbuf_usable_bytes == 212_984
    assert targets.get_target("trn1").sbuf_usable_bytes == 180_224
    assert targets.get_target("trn2").psum_banks * targets.get_target("trn2").psum_bank_bytes == 16 * 1024
    with pytest.raises(ValueError, match="unknown target"):
        targets.get_target("trn9")


def test_kernel_outputs_must_be_shared_hbm():
    with sim.installed():
        import nki.language as nl

    def kernel():
        return nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)

    with pytest.raises(sim.SimError, match="shared_hbm"):
        sim.run(kernel)
