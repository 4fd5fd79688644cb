"""RaceTracker's shortcuts (hull skip, arrays reused across launches) report exactly what a full scan does."""

from __future__ import annotations

from fusegen.sim.race import RaceTracker


def rows(first: int, count: int, width: int = 8) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The view of `count` whole rows of a [*, width] tensor from row `first`."""
    return (count, width), (width, 1), first * width


def test_disjoint_rows_then_an_overlap_is_a_race() -> None:
    tracker = RaceTracker(4 * 8, cores=2)
    assert tracker.on_write(0, 5, rows(0, 2)) is None
    assert tracker.on_write(1, 7, rows(2, 2)) is None  # outside core 0's hull: no conflict
    assert tracker.on_read(1, 8, rows(1, 1)) == (0, 5, "write")  # inside it: core 0's instruction 5
    assert tracker.on_write(0, 9, ((2,), (1,), 2 * 8 + 3)) == (1, 7, "write")  # 2 elements of row 2


def test_a_hull_that_overlaps_without_shared_elements_is_no_race() -> None:
    tracker = RaceTracker(4 * 8, cores=2)
    assert tracker.on_write(0, 1, ((4, 2), (8, 1), 0)) is None  # columns 0-1 of every row
    assert tracker.on_write(1, 2, ((4, 2), (8, 1), 4)) is None  # columns 4-5: inside the hull, disjoint


def test_later_epochs_and_later_launches_see_no_stale_codes() -> None:
    tracker = RaceTracker(4 * 8, cores=2)
    assert tracker.on_write(0, 1, rows(0, 4)) is None
    tracker.barrier(0)
    tracker.barrier(1)
    assert tracker.on_write(1, 1, rows(0, 4)) is None  # after a barrier on this tensor
    tracker.release()
    again = RaceTracker(4 * 8, cores=2)  # the next launch reuses the released arrays
    assert again.on_write(1, 3, rows(0, 4)) is None
    assert again.on_read(0, 4, rows(3, 1)) == (1, 3, "write")


def test_an_array_released_by_a_later_tracker_is_refilled() -> None:
    early = RaceTracker(5 * 8, cores=2)  # created before the other tracker's launch ends (threads)
    later = RaceTracker(5 * 8, cores=2)
    assert later.on_write(0, 1, rows(0, 5)) is None
    later.release()  # its codes (epoch 0, instruction 1) stay in the kept array
    assert early.on_write(1, 3, rows(4, 1)) is None  # core 1 takes that array
    assert early.on_read(0, 4, rows(0, 5)) == (1, 3, "write")  # row 4 only: no stale code of rows 0-3
