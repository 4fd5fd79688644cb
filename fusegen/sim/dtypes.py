"""NKI dtypes as torch dtypes, plus the conversions the engines apply on write."""

from __future__ import annotations

import torch

bool_ = torch.bool
int8 = torch.int8
int16 = torch.int16
int32 = torch.int32
uint8 = torch.uint8
uint16 = torch.uint16
uint32 = torch.uint32
float16 = torch.float16
float32 = torch.float32
bfloat16 = torch.bfloat16
tfloat32 = torch.float32  # tf32 storage is fp32; the reduced-mantissa matmul input is not modelled
#: the legacy Trainium e4m3 is another format than the OCP e4m3fn (ISA nc_matmul keeps them apart): it gets
#: torch's other e4m3, fnuz (largest finite 240 like an IEEE-style e4m3; one binade more below 2^-6, no inf)
float8_e4m3 = torch.float8_e4m3fnuz
float8_e4m3fn = torch.float8_e4m3fn  # OCP e4m3: no inf, largest finite 448
float8_e5m2 = torch.float8_e5m2

NAMES: dict[str, torch.dtype] = {
    "bool_": bool_,
    "int8": int8,
    "int16": int16,
    "int32": int32,
    "uint8": uint8,
    "uint16": uint16,
    "uint32": uint32,
    "float16": float16,
    "float32": float32,
    "bfloat16": bfloat16,
    "tfloat32": tfloat32,
    "float8_e4m3": float8_e4m3,
    "float8_e4m3fn": float8_e4m3fn,
    "float8_e5m2": float8_e5m2,
}
_BY_NAME_LOWER = {**NAMES, "bool": bool_, "fp32": float32, "bf16": bfloat16, "fp16": float16}


def to_torch(dtype: object) -> torch.dtype:
    """Accept a torch dtype or an NKI dtype name; return the torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in _BY_NAME_LOWER:
        return _BY_NAME_LOWER[dtype]
    raise TypeError(f"not an NKI dtype: {dtype!r}")


def is_float(dtype: torch.dtype) -> bool:
    """True for floating-point storage dtypes."""
    return dtype.is_floating_point


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element."""
    return dtype.itemsize


def fill_value(dtype: torch.dtype) -> float | int | bool:
    """Value new allocations start with: NaN for floats, the type's max for ints (a visible sentinel)."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return False
    return int(torch.iinfo(dtype).max)


def cast_for_store(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Convert fp32 results for an integer destination: round half to even, then saturate."""
    if dtype.is_floating_point or not value.dtype.is_floating_point or dtype == torch.bool:
        return value
    info = torch.iinfo(dtype)
    # float64: int32 bounds are not representable in fp32 (2**31 - 1 would round up and overflow)
    return torch.nan_to_num(value.double().round(), nan=0.0).clamp_(info.min, info.max)
