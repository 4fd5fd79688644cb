"""Inputs laid out the ways callers hand them over (README, "Calling generated code": storage offsets,
strides, slices, expanded vectors): the host must compute as with `.contiguous()` and leave them unwritten.
Memory a view does not cover holds NaN, so a kernel reading past its view shows."""

from __future__ import annotations

import random

import torch

#: a view's layout: a width slice of a wider row, the axes' order reversed in memory, a storage offset,
#: a stride-0 broadcast of the first position along the first axis
LAYOUTS = ("slice", "reversed", "offset", "expand")
PAD = 3  # NaN columns either side of a slice, NaN elements before an offset view


def pick_layouts(rng: random.Random, names: list[str], ranks: list[int],
                 share: float = 0.5) -> tuple[tuple[str, str], ...]:  # fmt: skip
    """For `share` of the cases, a layout for some of the inputs (reversed needs two axes)."""
    if rng.random() >= share:
        return ()
    picked = []
    for name, rank in zip(names, ranks, strict=True):
        if rng.random() < 0.5:
            picked.append((name, rng.choice([lay for lay in LAYOUTS if rank > 1 or lay != "reversed"])))
    return tuple(picked)


def _filler(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=t.dtype)


def lay_out(t: torch.Tensor, how: str | None) -> torch.Tensor:
    """`t` as a view laid out `how`; its values unchanged but for `expand`, which repeats the first slice."""
    if how == "slice":
        wide = _filler(t, (*t.shape[:-1], t.shape[-1] + 2 * PAD))
        wide[..., PAD : PAD + t.shape[-1]] = t
        return wide[..., PAD : PAD + t.shape[-1]]
    if how == "reversed":
        order = tuple(range(t.dim()))[::-1]
        return t.permute(order).contiguous().permute(order)
    if how == "offset":
        flat = _filler(t, (t.numel() + PAD,))
        flat[PAD:] = t.flatten()
        return flat[PAD:].view(t.shape)
    if how == "expand":
        return t.narrow(0, 0, 1).expand(t.shape)
    return t


def unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a view holds the same values (NaN equal to NaN)."""
    return bool(((before == after) | (before.isnan() & after.isnan())).all())
