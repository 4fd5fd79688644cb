"""Kernel folders are written whole: killed builds leave each folder fully old or fully new, and
`build --check` names leftovers and byte-level edits (line endings too)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusegen.cli import main
from fusegen.codegen import output
from fusegen.codegen.build import BuildOptions, build_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = [str(ROOT / "examples" / name) for name in ("swiglu_ffn.spec", "add_rmsnorm.spec")]

#: A child that writes two rendered versions of each kernel in turn forever, printing `ready` first: the
#: parent kills it at random moments of the write phase (it imports no torch, so it starts in ~0.1 s).
CHILD = """
import json, sys
from pathlib import Path
from fusegen.codegen.output import write_atomically
out, versions = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
print("ready", flush=True)
while True:
    for version in versions:
        for files in version:
            write_atomically(out, files)
"""

#: A child that writes the versions in turn `rounds` times and exits (0 when no write failed).
WRITER = """
import json, sys
from pathlib import Path
from fusegen.codegen.output import write_atomically
out, versions, rounds = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), int(sys.argv[3])
for _ in range(rounds):
    for version in versions:
        for files in version:
            write_atomically(out, files)
"""


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _render(out: Path) -> list[list[tuple[str, str]]]:
    """Two versions of every kernel's files: LNC 1 and LNC 2 differ."""
    return [[build_spec(s, BuildOptions(out, lnc=lnc)).files for s in SPECS] for lnc in (1, 2)]


def test_kill_loop_leaves_every_folder_fully_old_or_fully_new(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rendered = _render(out)
    versions: dict[str, list[dict[str, bytes]]] = {}
    for version in rendered:
        for files in version:
            name = files[0][0].partition("/")[0]
            versions.setdefault(name, []).append({r.partition("/")[2]: t.encode() for r, t in files})
    assert all(a != b for a, b in versions.values())  # else the test could not tell old from new
    (tmp_path / "versions.json").write_text(json.dumps(rendered))
    for files in rendered[0]:  # every folder exists before the first kill, however slow the child starts
        output.write_atomically(out, [tuple(f) for f in files])
    rng = random.Random(17)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(15):
        command = [sys.executable, "-c", CHILD, str(out), str(tmp_path / "versions.json")]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        for name, both in versions.items():
            assert _tree(out / name) in both, f"{name}: a mix of old and new files after a kill"
    assert main(["build", "--out", str(out), *SPECS]) == 0  # the clean rebuild
    assert output.leftovers(out) == []
    assert sorted(p.name for p in out.iterdir()) == sorted(versions)
    for name, both in versions.items():
        assert _tree(out / name) == both[1]
    assert main(["build", "--check", "--out", str(out), *SPECS]) == 0


def test_check_names_staging_leftovers_and_the_next_build_removes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    (tmp_path / ".swiglu_ffn.staging-abc123").mkdir()
    (tmp_path / "swiglu_ffn" / ".kernel.py.x1y2.tmp").write_text("half a file")
    capsys.readouterr()
    assert main(["build", "--check", "--out", str(tmp_path), SPECS[0]]) == 1
    out = capsys.readouterr().out
    assert ".swiglu_ffn.staging-abc123" in out and ".kernel.py.x1y2.tmp" in out
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    assert output.leftovers(tmp_path) == []
    assert main(["build", "--check", "--out", str(tmp_path), SPECS[0]]) == 0


def test_check_catches_a_crlf_conversion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    kernel = tmp_path / "swiglu_ffn" / "kernel.py"
    kernel.write_bytes(kernel.read_bytes().replace(b"\n", b"\r\n"))
    capsys.readouterr()
    assert main(["build", "--check", "--out", str(tmp_path), SPECS[0]]) == 1
    assert "swiglu_ffn/kernel.py" in capsys.readouterr().out
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    assert b"\r\n" not in kernel.read_bytes()


def test_a_build_killed_between_two_renames_is_recovered(tmp_path: Path) -> None:
    """Without renameat2 the old folder is parked first; a kill right then leaves no folder at all, and
    the next build puts the old one back before anything else."""
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    before = _tree(tmp_path / "swiglu_ffn")
    parked = tmp_path / ".swiglu_ffn.old-zz9"
    parked.mkdir()
    os.rename(tmp_path / "swiglu_ffn", parked / "x")
    output.recover(tmp_path)
    assert _tree(tmp_path / "swiglu_ffn") == before and output.leftovers(tmp_path) == []


def test_the_two_rename_swap_writes_whole_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "_exchange", lambda a, b: False)
    for lnc in (1, 2):
        built = build_spec(SPECS[0], BuildOptions(tmp_path, lnc=lnc))
        assert output.write_atomically(tmp_path, built.files)
        expected = {rel.partition("/")[2]: text.encode() for rel, text in built.files}
        assert _tree(tmp_path / "swiglu_ffn") == expected and output.leftovers(tmp_path) == []


def test_a_build_drops_files_it_does_not_write(tmp_path: Path) -> None:
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    (tmp_path / "swiglu_ffn" / "notes.txt").write_text("mine")
    assert main(["build", "--out", str(tmp_path), SPECS[0]]) == 0
    assert not (tmp_path / "swiglu_ffn" / "notes.txt").exists()


def test_concurrent_builds_into_one_folder_take_turns(tmp_path: Path) -> None:
    """Two builds writing the same kernels at once: without the lock one's recovery removed the other's
    staging folder mid-write (FileNotFoundError); with it both finish and every folder is whole."""
    out = tmp_path / "out"
    rendered = _render(out)
    (tmp_path / "versions.json").write_text(json.dumps(rendered))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", WRITER, str(out), str(tmp_path / "versions.json"), "15"]
    writers = [subprocess.Popen(command, stderr=subprocess.PIPE, env=env) for _ in range(3)]
    errors = [w.communicate(timeout=120)[1].decode() for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], errors
    assert output.leftovers(out) == []
    for version in rendered[-1]:
        name = version[0][0].partition("/")[0]
        assert _tree(out / name) == {r.partition("/")[2]: t.encode() for r, t in version}
