"""Storage of allocations: recycled flat tensors, and a caller tensor's storage span."""

from __future__ import annotations

import torch

ViewKey = tuple[tuple[int, ...], tuple[int, ...], int]  # (shape, strides, offset)
Storage = tuple[torch.Tensor, dict[ViewKey, torch.Tensor]]  # flat tensor, views of it by ViewKey


class StoragePool:
    """Flat tensors of freed allocations (with their cached views), reused by new allocations.

    Fresh memory costs a page fault per 4 KiB page on first touch, and kernels allocate many more tiles
    over a run than are live at once (the seed kernel: ~300 MB of fresh pages per run before pooling).
    """

    def __init__(self) -> None:
        self.free: dict[tuple[torch.dtype, int], list[Storage]] = {}
        self.closed = False

    def take(self, numel: int, dtype: torch.dtype) -> Storage:
        """A flat tensor with arbitrary contents, and the views cached on it so far."""
        stack = self.free.get((dtype, numel))
        return stack.pop() if stack else (torch.empty(numel, dtype=dtype), {})

    def give(self, *storages: Storage | None) -> None:
        """Return storage nobody references any more (dropped once the launch has finished)."""
        if not self.closed:
            for st in storages:
                if st is not None:
                    self.free.setdefault((st[0].dtype, st[0].numel()), []).append(st)

    def close(self) -> None:
        """Free everything; later returns are dropped."""
        self.closed = True
        self.free.clear()


def storage_span(tensor: torch.Tensor) -> torch.Tensor:
    """A flat view of `tensor`'s storage from its storage offset through the last element it addresses
    (views, slices and expanded tensors included; torch strides are never negative)."""
    steps = zip(tensor.shape, tensor.stride(), strict=True)
    extent = 0 if tensor.numel() == 0 else 1 + sum((n - 1) * s for n, s in steps)
    return torch.as_strided(tensor, (extent,), (1,), tensor.storage_offset())
