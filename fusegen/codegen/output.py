"""Writing generated kernel folders whole: stage beside the target, swap in, and clean up after a kill.

The guarantee, for a build killed at any instant (SIGKILL included; not a power loss, nothing is fsynced):
every kernel folder holds either all of its old files or all of its new ones. Each folder is rendered in
full into a hidden staging folder `.<kernel>.staging-XXXX` next to it, then swapped in. Where the kernel
and file system offer renameat2(RENAME_EXCHANGE) (Linux >= 3.15 on ext4, xfs, btrfs, tmpfs) the swap is
one atomic system call and the folder always exists. Elsewhere the old folder is first renamed to
`.<kernel>.old-XXXX` and the staged one renamed into place: a kill between those two renames leaves the
folder absent for a moment, and the next build (or `recover`) renames the old folder back. Leftover
staging and old folders are removed by the next build and reported by `fusegen build --check`.

Builds into one output folder take turns: each holds an exclusive lock on that folder while it recovers
and swaps (flock on the folder itself, released by the kernel when a build dies; where fcntl is missing,
a `.fusegen.lock` file created exclusively), so one build never removes another's staging folder.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

STAGING = ".staging-"
OLD = ".old-"
#: renameat2's flag to exchange two paths atomically, and "relative to the current directory".
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def write_atomically(out_dir: Path, files: Iterable[tuple[str, str]]) -> list[str]:
    """Write each kernel folder of `files` whole (staged, then swapped in); return the paths that changed."""
    folders: dict[str, dict[str, str]] = {}
    for rel, text in files:
        folder, _, name = rel.partition("/")
        folders.setdefault(folder, {})[name] = text
    changed = []
    out_dir.mkdir(parents=True, exist_ok=True)
    with locked(out_dir):
        recover(out_dir)
        for folder, texts in folders.items():
            target = out_dir / folder
            differ = _differing(target, texts)
            if not differ and not _extra_entries(target, texts):
                continue
            _swap_in(out_dir, folder, texts)
            changed += [f"{folder}/{name}" for name in differ]
    return changed


#: The fallback lock's file, and how old it may grow before a waiting build takes it as a dead build's.
LOCK_FILE = ".fusegen.lock"
STALE_LOCK_S = 600.0


@contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """Hold the output folder's exclusive build lock (waiting for another build to finish)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): an exclusively created file
        with _lock_file(out_dir / LOCK_FILE):
            yield
        return
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def _lock_file(path: Path) -> Iterator[None]:
    while True:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime > STALE_LOCK_S:
                    path.unlink()  # a build that died holding it
            except FileNotFoundError:
                pass
            time.sleep(0.05)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _swap_in(out_dir: Path, folder: str, texts: dict[str, str]) -> None:
    """Render `texts` into a staging folder beside `out_dir/folder` and put it in that folder's place."""
    staged = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{folder}{STAGING}"))
    os.chmod(staged, 0o777 & ~_umask())  # mkdtemp makes 0700; a kernel folder is an ordinary one
    for name, text in texts.items():
        (staged / name).write_bytes(text.encode())
    target = out_dir / folder
    if not target.exists():
        os.rename(staged, target)
    elif _exchange(staged, target):
        shutil.rmtree(staged)  # it now holds the old files
    else:
        old = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{folder}{OLD}"))
        os.rename(target, old / "x")  # rename needs an absent (or empty) target: park the old folder inside
        os.rename(staged, target)
        shutil.rmtree(old)


def _umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one system call; False where the platform cannot (then the caller renames twice)."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def recover(out_dir: Path) -> None:
    """Undo what a killed build left: put a parked old folder back where its kernel folder is missing,
    then remove every staging folder, parked folder and temporary file."""
    for old in sorted(out_dir.glob(f".*{OLD}*")) if out_dir.is_dir() else []:
        folder = out_dir / old.name[1:].rpartition(OLD)[0]
        parked = old / "x"
        if parked.is_dir() and not folder.exists():
            os.rename(parked, folder)
    for path in leftovers(out_dir):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def leftovers(out_dir: Path) -> list[Path]:
    """Staging folders, parked old folders and temporary files a killed build left in `out_dir`."""
    if not out_dir.is_dir():
        return []
    found = [p for p in out_dir.iterdir() if p.name.startswith(".") and (STAGING in p.name or OLD in p.name)]
    for folder in out_dir.iterdir():  # older fusegen wrote file by file through `.<file>.XXXX.tmp`
        if folder.is_dir() and not folder.name.startswith("."):
            found += [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    return sorted(found)


def stale_files(out_dir: Path, folder: str, files: Iterable[tuple[str, str]]) -> list[str]:
    """Files that differ byte for byte from a fresh build (line endings too), are missing, or are extra."""
    texts = {rel.partition("/")[2]: text for rel, text in files}
    target = out_dir / folder
    return [f"{folder}/{name}" for name in _differing(target, texts) + _extra_entries(target, texts)]


def _differing(target: Path, texts: dict[str, str]) -> list[str]:
    """The files of `texts` whose bytes in folder `target` are not their UTF-8 encoding (or are missing)."""
    return [name for name, text in sorted(texts.items()) if _bytes(target / name) != text.encode()]


def _extra_entries(target: Path, texts: dict[str, str]) -> list[str]:
    """Files in a kernel folder that a build does not write (bytecode caches aside)."""
    if not target.is_dir():
        return []
    return sorted(p.name for p in target.iterdir() if p.name not in texts and p.name != "__pycache__")


def _bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None
