"""A Target's cached hash stays in its process: pickled targets hash like targets built where they land."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

from fusegen.sim.targets import get_target

# Unpickles a target from stdin; prints its hash, the hash of the same target built here, and whether the
# two are equal and find each other as dict keys.
_CHILD = """
import pickle, sys
from fusegen.sim.targets import get_target
got, here = pickle.loads(sys.stdin.buffer.read()), get_target("trn2")
print(hash(got), hash(here), got == here, {here: 1}.get(got), {got: 1}.get(here))
"""


def test_an_unpickled_target_hashes_like_one_built_in_a_process_of_another_hash_seed() -> None:
    target = get_target("trn2")
    hash(target)  # cached before pickling, as after any cache lookup
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=pickle.dumps(target),
        capture_output=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
        check=True,
    )
    got, here, equal, found, found_back = child.stdout.decode().split()
    assert here != str(hash(target))  # the seeds differ: the same fields hash differently there
    assert (got, equal, found, found_back) == (here, "True", "1", "1")


def test_a_pickled_or_copied_target_is_equal_and_hashes_alike() -> None:
    target = get_target("trn1")
    for other in (pickle.loads(pickle.dumps(target)), copy.copy(target), copy.deepcopy(target)):
        assert other == target and other is not target
        assert hash(other) == hash(target)
        assert {target: 1}[other] == 1
