"""Tensor types of the `dl` dialect: dtype mapping to torch, shapes, broadcasting and promotion."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    Signedness,
    TensorType,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import AttrConstraint, VerificationContext
from xdsl.utils.exceptions import VerifyException


@dataclass(frozen=True)
class FloatTensorConstraint(AttrConstraint):
    """Operands of compute ops: tensors of f16, bf16 or f32 (with a message that says so)."""

    def verify(self, attr: Attribute, constraint_context: VerificationContext) -> None:
        if not isinstance(attr, TensorType) or not isinstance(attr.element_type, (Float16Type, BFloat16Type, Float32Type)):
            raise VerifyException(f"expected a tensor of f16, bf16 or f32, got {attr}")

    def get_bases(self) -> set[type[Attribute]] | None:
        return {TensorType}

    def mapping_type_vars(self, type_var_mapping) -> FloatTensorConstraint:
        return self


DLFloatTensor = FloatTensorConstraint()


@dataclass(frozen=True)
class BoolTensorConstraint(AttrConstraint):
    """Operands and results of comparisons and logical ops: tensors of i1 (torch.bool)."""

    def verify(self, attr: Attribute, constraint_context: VerificationContext) -> None:
        if not isinstance(attr, TensorType) or attr.element_type != i1:
            raise VerifyException(f"expected a boolean tensor (i1), got {attr}")

    def get_bases(self) -> set[type[Attribute]] | None:
        return {TensorType}

    def mapping_type_vars(self, type_var_mapping) -> BoolTensorConstraint:
        return self


DLBoolTensor = BoolTensorConstraint()

_TORCH_TO_XDSL: dict[torch.dtype, Attribute] = {
    torch.float16: f16,
    torch.bfloat16: bf16,
    torch.float32: f32,
    torch.float64: f64,
    torch.int64: i64,
    torch.int32: i32,
    torch.int16: IntegerType(16),
    torch.int8: IntegerType(8),
    torch.uint8: IntegerType(8, Signedness.UNSIGNED),  # (images: run by PyTorch, as every integer op is)
    torch.bool: i1,
}
_XDSL_TO_TORCH = {v: k for k, v in _TORCH_TO_XDSL.items()}
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def xdsl_dtype(dtype: torch.dtype) -> Attribute:
    try:
        return _TORCH_TO_XDSL[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no `dl` element type") from None


def torch_dtype(elem: Attribute) -> torch.dtype:
    try:
        return _XDSL_TO_TORCH[elem]
    except KeyError:
        raise TypeError(f"element type {elem} has no torch dtype") from None


def has_xdsl_dtype(dtype: torch.dtype) -> bool:
    return dtype in _TORCH_TO_XDSL


def tensor_type(shape: Sequence[int], dtype: torch.dtype | Attribute) -> TensorType:
    elem = xdsl_dtype(dtype) if isinstance(dtype, torch.dtype) else dtype
    return TensorType(elem, [int(s) for s in shape])


def shape_of(v: SSAValue | Attribute) -> tuple[int, ...]:
    t = v.type if isinstance(v, SSAValue) else v
    assert isinstance(t, TensorType), f"expected a tensor, got {t}"
    return tuple(t.get_shape())


def elem_of(v: SSAValue | Attribute) -> Attribute:
    t = v.type if isinstance(v, SSAValue) else v
    assert isinstance(t, TensorType), f"expected a tensor, got {t}"
    return t.element_type


def dtype_of(v: SSAValue | Attribute) -> torch.dtype:
    return torch_dtype(elem_of(v))


def dims_match(a: int, b: int) -> bool:
    """Two static-or-dynamic dims are compatible."""
    return a == b or a == DYNAMIC_INDEX or b == DYNAMIC_INDEX


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy/torch broadcasting; a dynamic dim broadcasts like an unknown size."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        non_one = {d for d in dims if d != 1}
        if len(non_one) > 1:
            static = {d for d in non_one if d != DYNAMIC_INDEX}
            if len(static) > 1:
                raise VerifyException(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
            non_one = static or non_one
        out.append(non_one.pop() if non_one else 1)
    return tuple(out)


def promote(types: Sequence[Attribute], ranks: Sequence[int]) -> Attribute:
    """torch's result dtype for an elementwise op (`torch.result_type`): the 0-d operands count only where their
    category (bool < integer < floating) is above the others' (an fp32 tensor times a 0-d fp64 tensor is fp32, an
    int32 tensor times a 0-d fp16 tensor fp16)."""
    dtypes = [torch_dtype(t) for t in types]
    dims = [d for d, r in zip(dtypes, ranks, strict=True) if r > 0]
    zeros = [d for d, r in zip(dtypes, ranks, strict=True) if r == 0]
    if not dims or not zeros:
        return xdsl_dtype(functools.reduce(torch.promote_types, dims or zeros))
    dim, zero = functools.reduce(torch.promote_types, dims), functools.reduce(torch.promote_types, zeros)
    if dim.is_floating_point:  # (c10's combine_categories)
        return xdsl_dtype(dim)
    return xdsl_dtype(torch.promote_types(dim, zero) if dim == torch.bool or zero.is_floating_point else dim)


def normalize_dim(dim: int, rank: int, what: str = "dim") -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise VerifyException(f"{what} {dim} is out of range for rank {rank}")
    return dim % rank if rank else 0


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
