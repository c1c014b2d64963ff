"""Softmax top-k MoE router (Mixtral / Switch / GShard style) with expert capacity and the load-balancing loss.

    ids, weights, aux_loss = topk_gating(logits, k, capacity_factor=None, renormalize=True)

logits [T, E] (any strides) -> ids [T, k] (index_dtype; experts by decreasing probability, -1 where dropped),
weights [T, k] (logits dtype; 0 where dropped), aux_loss [] float32.

Semantics, computed in float32:
  probs = softmax(logits, -1); ids, weights = top-k of probs (ties: lowest expert index; NaN ranks above every
  number, as in torch.topk: a row with a NaN or +inf logit, or all -inf, has NaN probabilities, and gets experts
  0, ..., k-1 with NaN weights, where torch.topk picks k experts of its own);
  renormalize: weights /= weights.sum(-1)  (Mixtral; off: the raw softmax probabilities, Switch/GShard).
  aux_loss = E * sum_e f_e * P_e, f_e = fraction of tokens routed to expert e (among their k choices, before
  capacity), P_e = mean over tokens of probs[:, e]; as in HF Mixtral: k when perfectly balanced, larger otherwise.
  capacity_factor c: each expert keeps at most ceil(c * T * k / E) assignments, earliest tokens first; later ones
  are dropped (id -1, weight 0). Weights are renormalized before dropping, not after.

Forward: one Triton kernel per block of tokens (softmax, top-k, renormalization, and the per-expert sums of
probabilities and assignment counts the loss needs, by atomics); with a capacity, a second kernel per block of
tokens drops, from the per-block expert counts, the assignments past it. Backward: one Triton kernel; gradients
flow to logits through the kept weights and the loss's mean probabilities (the counts are piecewise constant).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, launch, next_pow2
from .registry import Optional, Scalar, Sig, Tensor, in_range, register_op

MAX_EXPERTS = 1024  # one program holds a block of tokens x all experts in registers


class Routing(NamedTuple):
    """The router's output: ids [T, k] (-1: dropped), weights [T, k] (0: dropped), aux_loss []."""

    ids: torch.Tensor
    weights: torch.Tensor
    aux_loss: torch.Tensor


@triton.jit
def _topk_gating_kernel(
    logits_ptr, ids_ptr, weights_ptr, probs_ptr, prob_sum_ptr, count_ptr, block_count_ptr,
    T, E, stride_t, stride_e,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    RENORMALIZE: tl.constexpr, STORE_BLOCK_COUNTS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    slots = tl.arange(0, BLOCK_K)
    row_ok = rows < T
    col_ok = cols < E
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(logits_ptr + rows[:, None] * stride_t + cols[None, :] * stride_e, mask=mask, other=0.0)
    x = tl.where(col_ok[None, :], x.to(tl.float32), float("-inf"))
    z = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = z / tl.sum(z, axis=1)[:, None]
    tl.store(probs_ptr + rows[:, None] * E + cols[None, :], p, mask=mask)
    tl.atomic_add(prob_sum_ptr + cols, tl.sum(tl.where(mask, p, 0.0), axis=0), mask=col_ok)

    # top-k by repeated arg-max; a chosen expert is marked -1, padding columns are -2 (never chosen). A NaN
    # probability (the whole row, from a NaN or +inf logit or all -inf) ranks above every number, as in torch.topk:
    # key 2, so that the ids stay experts (NaN equals nothing) and its weight NaN
    q = tl.where(col_ok[None, :], tl.where(p != p, 2.0, p), -2.0)
    top_w = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    top_i = tl.zeros((BLOCK_T, BLOCK_K), tl.int32)
    for j in tl.static_range(K):
        best = tl.max(q, axis=1)
        idx = tl.min(tl.where(q == best[:, None], cols[None, :], BLOCK_E), axis=1)
        best = tl.where(best == 2.0, float("nan"), best)
        top_w = tl.where(slots[None, :] == j, best[:, None], top_w)
        top_i = tl.where(slots[None, :] == j, idx[:, None], top_i)
        q = tl.where(cols[None, :] == idx[:, None], -1.0, q)
    chosen_count = tl.sum(((q == -1.0) & mask).to(tl.int32), axis=0)
    tl.atomic_add(count_ptr + cols, chosen_count.to(tl.float32), mask=col_ok)
    if STORE_BLOCK_COUNTS:  # for the capacity kernel: assignments per expert in this block of tokens
        tl.store(block_count_ptr + tl.program_id(0) * E + cols, chosen_count, mask=col_ok)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=1)[:, None]
    out = rows[:, None] * K + slots[None, :]
    out_mask = row_ok[:, None] & (slots[None, :] < K)
    tl.store(ids_ptr + out, top_i, mask=out_mask)
    tl.store(weights_ptr + out, top_w, mask=out_mask)


@triton.jit
def _topk_gating_bwd_kernel(
    probs_ptr, ids_ptr, kept_ids_ptr, counts_ptr, d_weights_ptr, d_aux_ptr, d_logits_ptr,
    T, E, aux_scale, stride_t, stride_e,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, RENORMALIZE: tl.constexpr,
    HAS_KEEP: tl.constexpr, HAS_D_WEIGHTS: tl.constexpr, HAS_D_AUX: tl.constexpr,
):
    """d_logits = softmax backward of d_probs; d_probs comes from the weights kept (kept_ids >= 0; ids: before
    dropping), through the renormalization, and from aux_loss = aux_scale * sum_e counts[e] * sum_t probs[t, e].
    Computes in the dtype of probs."""
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    col_ok = cols < E
    mask = row_ok[:, None] & col_ok[None, :]
    p = tl.load(probs_ptr + rows[:, None] * E + cols[None, :], mask=mask, other=0.0)
    d_p = tl.zeros((BLOCK_T, BLOCK_E), p.dtype)
    if HAS_D_WEIGHTS:
        chosen = tl.zeros((BLOCK_T, BLOCK_E), tl.int1)
        chosen_sum = tl.zeros((BLOCK_T,), p.dtype)
        g_dot_p = tl.zeros((BLOCK_T,), p.dtype)
        for j in tl.static_range(K):
            idx = tl.load(ids_ptr + rows * K + j, mask=row_ok, other=0)
            g = tl.load(d_weights_ptr + rows * K + j, mask=row_ok, other=0.0).to(p.dtype)
            if HAS_KEEP:
                g = tl.where(tl.load(kept_ids_ptr + rows * K + j, mask=row_ok, other=0) >= 0, g, 0.0)
            hit = cols[None, :] == idx[:, None]
            p_j = tl.sum(tl.where(hit, p, 0.0), axis=1)
            chosen = chosen | hit
            chosen_sum += p_j
            g_dot_p += g * p_j
            d_p = tl.where(hit, g[:, None], d_p)
        if RENORMALIZE:  # w_j = p_j / s, s = sum of the chosen p: d p_i = (g_i - sum_j g_j w_j) / s
            s = tl.where(row_ok, chosen_sum, 1.0)
            d_p = tl.where(chosen, (d_p - (g_dot_p / s)[:, None]) / s[:, None], 0.0)
    if HAS_D_AUX:
        counts = tl.load(counts_ptr + cols, mask=col_ok, other=0.0).to(p.dtype)
        d_p += (tl.load(d_aux_ptr).to(p.dtype) * aux_scale) * counts[None, :]
    d_logits = p * (d_p - tl.sum(d_p * p, axis=1)[:, None])
    tl.store(d_logits_ptr + rows[:, None] * stride_t + cols[None, :] * stride_e, d_logits, mask=mask)


@triton.jit
def _capacity_kernel(
    ids_ptr, weights_ptr, out_ids_ptr, out_weights_ptr, block_cumcount_ptr, T, E, capacity,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """Copy ids/weights [T, K], dropping (-1, 0) each expert's assignments past `capacity` in token order.
    block_cumcount [blocks, E]: assignments per expert in the blocks of tokens up to and including each block."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    routed = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)  # routed[t, e]: token t chose expert e
    for j in tl.static_range(K):
        idx = tl.load(ids_ptr + rows * K + j, mask=row_ok, other=-1)
        routed += (cols[None, :] == idx[:, None]).to(tl.int32)
    upto = tl.load(block_cumcount_ptr + pid * E + cols, mask=cols < E, other=0)
    before = (upto - tl.sum(routed, axis=0))[None, :] + tl.cumsum(routed, axis=0) - routed  # earlier tokens'
    for j in tl.static_range(K):
        idx = tl.load(ids_ptr + rows * K + j, mask=row_ok, other=-1)
        keep = tl.sum(tl.where(cols[None, :] == idx[:, None], before, 0), axis=1) < capacity
        w = tl.load(weights_ptr + rows * K + j, mask=row_ok, other=0.0)
        tl.store(out_ids_ptr + rows * K + j, tl.where(keep, idx, -1), mask=row_ok)
        tl.store(out_weights_ptr + rows * K + j, tl.where(keep, w, 0.0), mask=row_ok)


def _blocks(T: int, E: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_E): all experts of a block of tokens, ~2048 elements a program."""
    block_e = next_pow2(E)
    return min(next_pow2(T), max(1, 2048 // block_e)), block_e


def expert_capacity(num_tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    """Assignments an expert keeps: ceil(capacity_factor * T * k / E)."""
    return math.ceil(capacity_factor * num_tokens * k / num_experts)


def _capacity_keep(ids: torch.Tensor, capacity: int) -> torch.Tensor:
    """[T, k] bool: whether assignment (t, j) is among the first `capacity` of its expert in token order."""
    flat = ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    rank = torch.arange(flat.numel(), device=flat.device) - torch.searchsorted(sorted_ids, sorted_ids)
    keep = torch.empty_like(rank, dtype=torch.bool)
    keep[order] = rank < capacity
    return keep.view(ids.shape)


def _drop_torch(ids: torch.Tensor, weights: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    keep = _capacity_keep(ids, capacity)
    return ids.masked_fill(~keep, -1), weights.masked_fill(~keep, 0)


def _route_triton(
    logits: torch.Tensor, k: int, renormalize: bool, index_dtype: torch.dtype, capacity: int | None
) -> tuple[torch.Tensor, ...]:
    """(probs f32 [T, E], ids [T, k] before dropping, prob_sum f32 [E], counts f32 [E], ids, weights [T, k])
    from the kernels; the last two after dropping what exceeds the capacity."""
    T, E = logits.shape
    dev = logits.device
    probs = torch.empty(T, E, device=dev, dtype=torch.float32)
    ids = torch.empty(T, k, device=dev, dtype=index_dtype)
    weights = torch.empty(T, k, device=dev, dtype=logits.dtype)
    sums = torch.zeros(2, E, device=dev, dtype=torch.float32)
    if T == 0:  # (a grid of no programs is not launched)
        return probs, ids, sums[0], sums[1], ids, weights
    block_t, block_e = _blocks(T, E)
    grid = (triton.cdiv(T, block_t),)
    block_counts = torch.empty(grid[0] if capacity is not None else 0, E, device=dev, dtype=torch.int32)
    launch(
        _topk_gating_kernel, grid, dev,
        logits, ids, weights, probs, sums[0], sums[1], block_counts, T, E, logits.stride(0), logits.stride(1),
        K=k, BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=next_pow2(k), RENORMALIZE=renormalize,
        STORE_BLOCK_COUNTS=capacity is not None, num_warps=4,
    )
    if capacity is None:
        return probs, ids, sums[0], sums[1], ids, weights
    kept_ids, kept_weights = torch.empty_like(ids), torch.empty_like(weights)
    block_cumcounts = torch.cumsum(block_counts, 0, dtype=torch.int32)
    launch(
        _capacity_kernel, grid, dev,
        ids, weights, kept_ids, kept_weights, block_cumcounts, T, E, capacity,
        K=k, BLOCK_T=block_t, BLOCK_E=block_e, num_warps=4,
    )
    return probs, ids, sums[0], sums[1], kept_ids, kept_weights


def _route_torch(
    logits: torch.Tensor, k: int, renormalize: bool, index_dtype: torch.dtype, capacity: int | None
) -> tuple[torch.Tensor, ...]:
    """_route_triton's outputs computed by torch, in float64 for float64 logits: with it, gradcheck checks the
    backward kernel in float64."""
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    top_w, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    counts = torch.bincount(ids.reshape(-1), minlength=logits.shape[1]).to(probs.dtype)
    ids, top_w = ids.to(index_dtype), top_w.to(logits.dtype)
    kept = (ids, top_w) if capacity is None else _drop_torch(ids, top_w, capacity)
    return probs, ids, probs.sum(0), counts, *kept


class _TopKGating(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        k: int,
        capacity_factor: float | None,
        renormalize: bool,
        index_dtype: torch.dtype,
        use_triton: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        T, E = logits.shape
        capacity = None if capacity_factor is None else expert_capacity(T, k, E, capacity_factor)
        route = _route_triton if use_triton else _route_torch
        probs, ids, prob_sum, counts, kept_ids, kept_weights = route(
            logits, k, renormalize, index_dtype, capacity
        )
        aux = counts.dot(prob_sum) * (E / T**2 if T else 0.0)  # no tokens: no load to balance
        ctx.save_for_backward(probs, ids, None if capacity is None else kept_ids, counts)
        ctx.renormalize, ctx.logits_dtype = renormalize, logits.dtype
        ctx.mark_non_differentiable(kept_ids)
        ctx.set_materialize_grads(False)
        return kept_ids, kept_weights, aux

    @staticmethod
    def backward(
        ctx: Any, _d_ids: torch.Tensor | None, d_weights: torch.Tensor | None, d_aux: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        probs, ids, kept_ids, counts = ctx.saved_tensors
        T, E = probs.shape
        d_logits = torch.empty(T, E, device=probs.device, dtype=ctx.logits_dtype)
        if T == 0:  # no tokens: an empty gradient (and aux_loss, 0, does not depend on the logits)
            return d_logits, None, None, None, None, None
        block_t, block_e = _blocks(T, E)
        unused = probs  # stands in for the pointer of an absent input
        launch(
            _topk_gating_bwd_kernel, (triton.cdiv(T, block_t),), probs.device,
            probs, ids, unused if kept_ids is None else kept_ids, counts,
            unused if d_weights is None else d_weights.contiguous(), unused if d_aux is None else d_aux,
            d_logits, T, E, E / T**2, d_logits.stride(0), d_logits.stride(1),
            K=ids.shape[1], BLOCK_T=block_t, BLOCK_E=block_e, RENORMALIZE=ctx.renormalize,
            HAS_KEEP=kept_ids is not None, HAS_D_WEIGHTS=d_weights is not None, HAS_D_AUX=d_aux is not None,
            num_warps=4,
        )
        return d_logits, None, None, None, None, None


def _check_args(logits: torch.Tensor, k: int, capacity_factor: float | None, index_dtype: torch.dtype) -> None:
    if logits.dim() != 2:
        raise ValueError(f"topk_gating: logits must be [T, E], got shape {list(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"topk_gating: k={k} must be in [1, E={logits.shape[1]}]")
    if capacity_factor is not None and capacity_factor <= 0:
        raise ValueError(f"topk_gating: capacity_factor={capacity_factor} must be > 0")
    if index_dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_gating: index_dtype must be torch.int32 or torch.int64, got {index_dtype}")


def topk_gating(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float | None = None,
    renormalize: bool = True,
    index_dtype: torch.dtype = torch.int64,
) -> Routing:
    """Softmax top-k routing of logits [T, E] (see the module docstring); differentiable w.r.t. logits through
    weights and aux_loss. Runs the Triton kernel (on CPU: under TRITON_INTERPRET=1)."""
    _check_args(logits, k, capacity_factor, index_dtype)
    if logits.shape[1] > MAX_EXPERTS:
        raise ValueError(f"topk_gating: E={logits.shape[1]} experts exceeds the kernel's {MAX_EXPERTS}")
    return Routing(*_TopKGating.apply(logits, k, capacity_factor, renormalize, index_dtype, True))


def topk_gating_reference(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float | None = None,
    renormalize: bool = True,
    index_dtype: torch.dtype = torch.int64,
) -> Routing:
    """topk_gating in plain torch ops (autograd through them); the reference of the tests and benchmarks.
    Computes in float32, or float64 for float64 logits."""
    _check_args(logits, k, capacity_factor, index_dtype)
    T, E = logits.shape
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    routed_fraction = torch.nn.functional.one_hot(ids, E).sum((0, 1)).to(probs.dtype) / max(T, 1)
    aux_loss = E * (routed_fraction * probs.sum(0) / max(T, 1)).sum()  # no tokens: 0, as topk_gating
    if capacity_factor is not None:
        ids, weights = _drop_torch(ids, weights, expert_capacity(T, k, E, capacity_factor))
    return Routing(ids.to(index_dtype), weights.to(logits.dtype), aux_loss)


def _signature(dtypes: tuple[str, ...], max_experts: int | None) -> Sig:
    return Sig(
        Tensor("T", "E", dtypes=dtypes, name="logits"),
        Scalar(int, sym="k", name="k"),
        Optional(Scalar(float, name="capacity_factor")),
        Scalar(bool, default=True, name="renormalize"),
        Scalar(torch.dtype, default=torch.int64, name="index_dtype"),
        constraints=[in_range("k", 1, "E"), *([in_range("E", 1, max_experts)] if max_experts else [])],
        token=("T",),
    )


register_op(
    "topk_gating",
    topk_gating,
    _signature(FLOAT_DTYPES, MAX_EXPERTS),
    description="softmax top-k router with capacity and load-balancing loss; one Triton kernel per token block",
    impl_name="triton",
)
register_op(
    "topk_gating",
    topk_gating_reference,
    _signature((*FLOAT_DTYPES, "f64"), None),
    description="the same router in torch ops",
    impl_name="torch",
)
