"""Expert-parallel mixture of experts over torch.distributed: each rank holds E / world_size of the experts.

    layer = EPMoE(router_weight, w_gate_up, w_down, top_k, group=group)   # the full weights, on every rank
    out = layer(x)                                                        # x [T, H] or [B, S, H]: this rank's tokens

Forward, on each rank (experts are SwiGLU MLPs, weights laid out as for fused_moe):
  1. route: logits = x @ router_weight.T (float32; float64 for float64 x), then softmax top-k with capacity over
     THIS RANK'S tokens (topk_gating): an expert keeps at most ceil(c * T_rank * k / E) assignments of each rank;
  2. dispatch: the kept (token, slot) pairs, sorted by expert (hence by the rank that owns it), are exchanged with
     `all_to_all_single`: first the per-expert counts, then the token rows with variable split sizes. A received
     row's expert follows from the counts (rows arrive grouped by source rank, then expert), so no ids are sent;
  3. compute: the received rows through the local experts (fused_moe with k = 1 and unit weights);
  4. combine: the inverse `all_to_all_single` returns the results; the routing weights, which never leave the
     sending rank, scale them and one pass sums each token's k rows (in float32; float64 for float64 x): a Triton
     kernel that gathers a token's rows by their position in the returned buffer (the torch gather on the
     reference backend), where an index_add over float32 copies of all rows used to take ~5x its traffic.
With `padded_tokens` (the most tokens any rank passes in a call; the same on every rank) the rows travel in
fixed blocks with room for every pair, so nothing waits for the host (see `_padded_exchange`): a decode-sized
mode. Otherwise the plan waits for the host once per call: the per-expert counts, exchanged first, give the split sizes `all_to_all_single` needs (the kept pairs are counted and sorted on the GPU without a nonzero, which would wait
for the router too).
With `peer_tokens` (likewise the most tokens any rank passes in a call) the rows go straight into the other
GPUs' memory (`peer_exchange`: CUDA symmetric memory, counts exchanged on the GPUs, three stream barriers), so
neither NCCL nor the host is in the exchange; a token travels once to each rank holding any of its experts, and
that rank returns one weighted sum of their outputs.
With overlap, the pairs are split by the half of the tokens they come from: both halves' dispatches are issued
asynchronously at once, so the second half's proceeds while the first half computes, and the first half's combine
while the second half computes. Ranks vote for overlap in the counts exchange and split only if all of them do,
so ranks with different token counts agree (off by default: see EPMoE). The peer exchange overlaps its own way
(`run_peer_exchange_overlapped`). Inference only: no autograd through the exchange.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from torch import nn

from ..runtime.graphs import captured
from .common import launch, next_pow2
from .gating import topk_gating, topk_gating_reference
from .moe_gemm import default_config, fused_moe, fused_moe_reference
from .peer_exchange import PeerBuffers, PeerExchange

BACKENDS = ("auto", "triton", "reference")
OVERLAP_MIN_TOKENS = 1024  # overlap="auto" votes for two chunks from this many tokens on the rank


def router_logits(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """x [T, H] @ router_weight [E, H].T in float32 (float64 for float64 x)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    return x.to(dtype) @ router_weight.to(dtype).T


def moe_reference(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    capacity_factor: float | None = None,
    renormalize: bool = True,
) -> torch.Tensor:
    """The whole MoE layer in one process, in torch ops: topk_gating_reference on router_logits, then the loop over
    experts (fused_moe_reference) in x's dtype. x [..., H] -> [..., H].

    Routing, hence the capacity, is over all of x's tokens in one call. EPMoE routes each rank's tokens on their
    own, so to reproduce it on world_size ranks (with a capacity; without one routing is per token anyway), call
    this on each rank's tokens separately."""
    x2 = x.reshape(-1, x.shape[-1])
    ids, weights, _ = topk_gating_reference(router_logits(x2, router_weight), top_k, capacity_factor, renormalize)
    return fused_moe_reference(x2, w_gate_up, w_down, ids, weights).view(x.shape)


class _PhaseTimer:
    """Milliseconds per phase, summed over the intervals between consecutive `lap`s: CUDA events on the current
    stream (so communication hidden behind compute counts nowhere), else time.perf_counter. Off without a dict."""

    def __init__(self, timings: dict[str, float] | None, device: torch.device) -> None:
        self.timings = timings
        self.cuda = device.type == "cuda"
        self.laps: list[tuple[str, Any, Any]] = []
        self.last = self._now() if timings is not None else None

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self, phase: str) -> None:
        """The time since the previous lap was spent in `phase`."""
        if self.timings is not None:
            now = self._now()
            self.laps.append((phase, self.last, now))
            self.last = now

    def finish(self) -> None:
        """Fill the dict (synchronizes on CUDA): one entry per phase, and their sum as "total"."""
        if self.timings is None:
            return
        if self.cuda:
            self.last.synchronize()
        totals: dict[str, float] = {}
        for phase, start, end in self.laps:
            ms = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
            totals[phase] = totals.get(phase, 0.0) + ms
        totals["total"] = sum(totals.values())
        self.timings.clear()
        self.timings.update(totals)


class _Exchange(NamedTuple):
    """One all_to_all round trip. tok: the token of each row this rank sends, grouped by destination rank, then
    expert; pair: that row's (token, slot) as token * k + slot; send_splits / recv_splits: rows to / from each
    rank; recv_expert: the local expert of each row received."""

    tok: torch.Tensor
    pair: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_expert: torch.Tensor


@triton.jit
def _combine_kernel(back_ptr, pos_ptr, w_ptr, out_ptr, H, K: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum over slots s with pos[t, s] >= 0 of w[t, s] * back[pos[t, s]], accumulated in float32."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    inside = cols < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for s in tl.static_range(K):
        row = tl.load(pos_ptr + t * K + s)
        if row >= 0:
            w = tl.load(w_ptr + t * K + s).to(tl.float32)
            acc += w * tl.load(back_ptr + row.to(tl.int64) * H + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


def combine(back: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor, use_triton: bool) -> torch.Tensor:
    """out [T, H]: each token's returned rows back[pos[t, s]] (pos -1: a dropped slot) scaled by weights [T, k]
    and summed in float32 (float64 for float64 rows), in back's dtype."""
    T, k = pos.shape
    out = back.new_empty(T, back.shape[1])
    if T == 0:
        return out
    if use_triton and back.dtype != torch.float64:
        block = min(1024, next_pow2(back.shape[1]))
        launch(_combine_kernel, (T, triton.cdiv(back.shape[1], block)), back.device,
               back.contiguous(), pos.contiguous(), weights.contiguous(), out, back.shape[1], K=k, BLOCK_H=block)
        return out
    acc = torch.promote_types(back.dtype, torch.float32)
    rows = torch.where(pos[..., None] >= 0, back.to(acc)[pos.clamp(min=0)], 0)  # [T, k, H]; a dropped slot's row
    scale = torch.where(pos >= 0, weights.to(acc), 0)  # may hold anything (NaN from an earlier call): not read
    return torch.einsum("tkh,tk->th", rows, scale).to(back.dtype)


def run_peer_exchange(
    ex: PeerExchange, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts, use_triton: bool,
    timer: _PhaseTimer | None = None,
) -> torch.Tensor:
    """One call of the exchange through peer buffers on this rank: the four steps with a barrier after each of the
    first three (tests on a CPU run the ranks' steps in turn instead)."""
    lap = timer.lap if timer is not None else (lambda _phase: None)
    sends = ex.send_counts(ids, use_triton)
    ex.buffers.barrier()
    lap("plan")
    pos = ex.send_rows(x, weights, sends, use_triton)
    ex.buffers.barrier()
    lap("dispatch")
    ex.compute_and_return(experts, use_triton)
    ex.buffers.barrier()
    lap("compute")
    out = combine(ex.buffers.own["back"], pos, torch.ones(pos.shape, device=x.device), use_triton)
    lap("combine")
    return out


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}  # the overlapped peer exchange's second stream, by device


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    if device.type != "cuda":
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def run_peer_exchange_overlapped(
    halves: tuple[PeerExchange, PeerExchange], x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
    experts: Callable, use_triton: bool, timer: _PhaseTimer | None = None,
) -> torch.Tensor:
    """One call with its tokens in two halves, each through its own peer buffers (`halves`; see peer_exchange's
    docstring): on CUDA a second stream dispatches both halves and returns each half's partial sums while this
    stream runs the experts, first half then second. The order is the same on every rank (ranks with fewer
    tokens have smaller halves, maybe empty ones); on a CPU the steps run in that order on one thread."""
    lap = timer.lap if timer is not None else (lambda _phase: None)
    T = x.shape[0]
    cut = (T + 1) // 2
    parts = (slice(0, cut), slice(cut, T))
    main = torch.cuda.current_stream(x.device) if x.is_cuda else None
    side = _side_stream(x.device)

    def on_side():  # (on a CPU: no second stream)
        return torch.cuda.stream(side) if side is not None else contextlib.nullcontext()

    def signal() -> torch.cuda.Event | None:
        return torch.cuda.current_stream(x.device).record_event() if x.is_cuda else None

    if side is not None:
        side.wait_stream(main)  # (the route; and the previous call's reads of every buffer, on this rank)
    dispatched, positions = [], []
    with on_side():
        for ex, part in zip(halves, parts, strict=True):
            sends = ex.send_counts(ids[part], use_triton)
            ex.buffers.barrier()
            positions.append(ex.send_rows(x[part], weights[part], sends, use_triton))
            ex.buffers.barrier()
            dispatched.append(signal())
    lap("dispatch")
    computed = []  # (what this stream made and the side stream reads: alive until the streams join)
    for ex, ready in zip(halves, dispatched, strict=True):
        if ready is not None:
            main.wait_event(ready)
        computed.append((ex.compute(experts), signal()))
    lap("compute")
    with on_side():
        for ex, (done, ready) in zip(halves, computed, strict=True):
            if ready is not None:
                side.wait_event(ready)
            ex.send_back(done, use_triton)
            ex.buffers.barrier()
    if side is not None:
        main.wait_stream(side)
    outs = [combine(ex.buffers.own["back"], pos, torch.ones(pos.shape, device=x.device), use_triton)
            for ex, pos in zip(halves, positions, strict=True)]  # fmt: skip
    out = torch.cat(outs)
    lap("combine")
    return out


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(world size, rank) of the group; (1, 0) with no group and torch.distributed not initialized."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


class EPMoE(nn.Module):
    """Expert-parallel SwiGLU MoE layer (see the module docstring).

    router_weight [E, H], w_gate_up [E, 2I, H] (gate rows first, then up), w_down [E, H, I]: the full weights,
    the same on every rank; the layer keeps the router and the experts [rank * E/ws, (rank + 1) * E/ws).
    capacity_factor, renormalize: as topk_gating (capacity per rank's tokens). group: the expert-parallel group
    (None: the default group, or no communication if torch.distributed is not initialized). backend: "triton"
    (topk_gating + fused_moe), "reference" (topk_gating_reference + the loop over experts) or "auto" (triton on
    CUDA tensors). overlap: True, False (default) or "auto" (two chunks from OVERLAP_MIN_TOKENS tokens a rank,
    if world size > 1). Off by default because it measured slower on 2 NVLink-connected H200s (Mixtral-like layer,
    4096 tokens a rank: 9.05 vs 7.31 ms; DeepSeek-like: equal): the exchange takes ~0.2 ms against ~5 ms of
    expert GEMMs, and half-size GEMMs lose more than the hidden communication gains. All ranks of the group must
    call forward together. padded_tokens: None (default: split sizes from the exchanged counts, one wait for the
    host per call) or the most tokens any rank passes in one call, the same on every rank: fixed blocks of
    padded_tokens * top_k rows per pair of ranks, no wait for the host (overlap is then ignored). peer_tokens:
    None (default) or, likewise, the most tokens any rank passes: the exchange through the GPUs' memory
    (`peer_exchange`; CUDA tensors, every call on the same stream). With overlap (True, or "auto" from
    peer_tokens >= OVERLAP_MIN_TOKENS: decided from the arguments, so every rank agrees without a vote) each
    call runs in two halves, a second stream moving one half's rows while the other half's experts run
    (`run_peer_exchange_overlapped`), each half with buffers of half the room. Its buffers are allocated on the first
    call of each dtype (a collective) and shared by every EPMoE of the process with the same group, sizes and
    dtype (layers run one after another, so one set serves them all); they hold room for every rank's tokens
    at one rank, ~2 * ws * peer_tokens * H elements. cuda_graphs: replay calls on CUDA from a graph per input
    shape (with one GPU, or with padded_tokens or peer_tokens, whose exchanges never wait for the host; not
    with the reference backend, whose torch ops do): the first call of a shape runs eagerly, the graphs share
    one memory pool; a decode-sized call is otherwise mostly the host issuing ~100 small operations. A rank
    that raises inside a call (more tokens than padded_tokens / peer_tokens, say) leaves the others waiting
    in the exchange, as with any collective (in the peer exchange, until barrier_timeout_s). After forward,
    `last_aux_loss` holds this rank's load-balancing loss (a tensor of its own, also after a replay).
    barrier_timeout_s (peer exchange only; default 600, NCCL's default timeout; None: wait forever): a rank that
    waits longer than this at one of the exchange's barriers (another rank died, or skipped the call) stops its
    GPU with torch's "barrier timeout" message, which fails the process (its CUDA context is lost) instead of
    leaving it spinning."""

    def __init__(
        self,
        router_weight: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        top_k: int,
        *,
        capacity_factor: float | None = None,
        renormalize: bool = True,
        group: dist.ProcessGroup | None = None,
        backend: str = "auto",
        overlap: bool | str = False,
        padded_tokens: int | None = None,
        peer_tokens: int | None = None,
        cuda_graphs: bool = False,
        barrier_timeout_s: float | None = 600.0,
    ) -> None:
        super().__init__()
        E, H = router_weight.shape
        inter = w_down.shape[-1]
        if tuple(w_gate_up.shape) != (E, 2 * inter, H) or tuple(w_down.shape) != (E, H, inter):
            raise ValueError(
                f"EPMoE: router_weight {list(router_weight.shape)} needs w_gate_up [E, 2I, H] and w_down [E, H, I];"
                f" got {list(w_gate_up.shape)} and {list(w_down.shape)}"
            )
        if backend not in BACKENDS:
            raise ValueError(f"EPMoE: backend must be one of {BACKENDS}, got {backend!r}")
        for name, value in (("padded_tokens", padded_tokens), ("peer_tokens", peer_tokens)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"EPMoE: {name} must be a positive int or None, got {value!r}")
        if padded_tokens is not None and peer_tokens is not None:
            raise ValueError("EPMoE: padded_tokens and peer_tokens choose two different exchanges; give one")
        if barrier_timeout_s is not None and (isinstance(barrier_timeout_s, bool) or not isinstance(
                barrier_timeout_s, (int, float)) or not barrier_timeout_s > 0):  # fmt: skip
            raise ValueError(f"EPMoE: barrier_timeout_s must be a positive number of seconds or None, got "
                             f"{barrier_timeout_s!r}")
        if overlap not in (True, False, "auto"):
            raise ValueError(f"EPMoE: overlap must be True, False or 'auto', got {overlap!r}")
        self.world_size, self.rank = _world(group)
        if E % self.world_size:
            raise ValueError(f"EPMoE: {E} experts do not split evenly over {self.world_size} ranks")
        self.num_experts, self.local_experts = E, E // self.world_size
        first = self.rank * self.local_experts

        def local(w: torch.Tensor) -> nn.Parameter:  # a copy, so that the other ranks' experts can be freed
            part = w.detach()[first : first + self.local_experts]
            return nn.Parameter(part if self.world_size == 1 else part.clone(), requires_grad=False)

        self.router_weight = nn.Parameter(router_weight.detach(), requires_grad=False)
        self.w_gate_up, self.w_down = local(w_gate_up), local(w_down)
        self.top_k, self.capacity_factor, self.renormalize = top_k, capacity_factor, renormalize
        self.group, self.backend, self.overlap, self.padded_tokens = group, backend, overlap, padded_tokens
        self.peer_tokens, self._peers = peer_tokens, {}  # dtype -> PeerExchange
        self._timeout_ms = 0 if barrier_timeout_s is None else max(1, round(barrier_timeout_s * 1000))
        if cuda_graphs and padded_tokens is None and peer_tokens is None and self.world_size > 1:
            raise ValueError("EPMoE: cuda_graphs needs an exchange that never waits for the host: padded_tokens "
                             "or peer_tokens")
        if cuda_graphs and backend == "reference":
            raise ValueError("EPMoE: cuda_graphs needs the Triton kernels (backend 'triton' or 'auto'): the "
                             "reference backend's torch ops wait for the host")
        self.cuda_graphs, self._graphs, self._pool = cuda_graphs, {}, None
        self.last_aux_loss: torch.Tensor | None = None

    @torch.no_grad()
    def forward(self, x: torch.Tensor, timings: dict[str, float] | None = None) -> torch.Tensor:
        """x [..., H], this rank's tokens -> [..., H]. A `timings` dict is filled with milliseconds per phase
        (route, plan, dispatch, compute, combine; total; plan: sorting the pairs and exchanging the counts),
        measured by CUDA events on CUDA (which synchronizes; such a call is never replayed from a graph)."""
        if self.cuda_graphs and x.is_cuda and timings is None:
            return self._replay(x)
        return self._forward(x, timings)

    def _replay(self, x: torch.Tensor) -> torch.Tensor:
        """The call through a CUDA graph per input shape and dtype: the first call of a shape runs eagerly (it
        compiles the kernels and, in the peer exchange, allocates the buffers), the second captures (which runs
        nothing) and replays, so every call runs the exchange exactly once on every rank, whatever shapes the
        other ranks see. Returns a copy of the graph's output (the next replay overwrites it)."""
        key = (tuple(x.shape), x.dtype, x.device)
        entry = self._graphs.get(key)
        if entry is None:
            self._graphs[key] = "seen"
            return self._forward(x, None)
        if entry == "seen":
            static_x = x.clone()
            graph = torch.cuda.CUDAGraph()
            self._pool = self._pool or torch.cuda.graph_pool_handle()
            # one pool for every shape's graph: what lives across replays (static_x, the exchange's buffers) is
            # outside it, and each replay's output and aux loss are copied out before the next replay
            with captured(graph, pool=self._pool):  # (its cuBLAS workspace in that pool too: runtime.graphs)
                static_out = self._forward(static_x, None)
            self._graphs[key] = entry = (graph, static_x, static_out, self.last_aux_loss)
        graph, static_x, static_out, aux = entry
        static_x.copy_(x)
        graph.replay()
        self.last_aux_loss = aux.clone()
        return static_out.clone()

    def _forward(self, x: torch.Tensor, timings: dict[str, float] | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        use_triton = self.backend == "triton" or (self.backend == "auto" and x.is_cuda)
        timer = _PhaseTimer(timings, x.device)
        gate = topk_gating if use_triton else topk_gating_reference
        logits = router_logits(x2, self.router_weight)
        ids, weights, self.last_aux_loss = gate(logits, self.top_k, self.capacity_factor, self.renormalize)
        timer.lap("route")
        if self.world_size == 1:
            out = self._experts(x2, ids, weights, use_triton)
            timer.lap("compute")
        else:
            out = self._exchange_and_compute(x2, ids, weights, use_triton, timer)
        timer.finish()
        return out.view(x.shape)

    def _experts(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, use_triton: bool) -> torch.Tensor:
        """The local experts on rows x [n, H] routed by ids / weights [n, k] (local expert ids)."""
        if x.shape[0] == 0:
            return torch.zeros_like(x)
        moe = fused_moe if use_triton else fused_moe_reference
        return moe(x, self.w_gate_up, self.w_down, ids, weights)

    def _exchange_and_compute(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, use_triton: bool, timer: _PhaseTimer
    ) -> torch.Tensor:
        if self.padded_tokens is not None:
            return self._padded_exchange(x, ids, weights, use_triton, timer)
        if self.peer_tokens is not None:
            return self._peer_exchange(x, ids, weights, use_triton, timer)
        exchanges = self._plan(ids, weights)
        timer.lap("plan")
        dispatches = []
        for ex in exchanges:  # all issued at once: the second chunk's moves while the first computes
            send, recv = x[ex.tok], x.new_empty(sum(ex.recv_splits), x.shape[1])
            work = dist.all_to_all_single(recv, send, ex.recv_splits, ex.send_splits, group=self.group, async_op=True)
            dispatches.append((send, recv, work))
        combines = []
        for ex, (_, recv, work) in zip(exchanges, dispatches, strict=True):
            work.wait()
            timer.lap("dispatch")
            unit = torch.ones(recv.shape[0], 1, device=x.device, dtype=torch.float32)
            y = self._experts(recv, ex.recv_expert[:, None], unit, use_triton)
            timer.lap("compute")
            back = x.new_empty(ex.tok.shape[0], x.shape[1])
            work = dist.all_to_all_single(back, y, ex.send_splits, ex.recv_splits, group=self.group, async_op=True)
            combines.append((y, back, work))
        pos = torch.full((ids.numel(),), -1, device=x.device, dtype=torch.int32)  # (token, slot) -> row of backs
        start = 0
        for ex, (_, back, work) in zip(exchanges, combines, strict=True):
            work.wait()
            pos[ex.pair] = torch.arange(start, start + back.shape[0], device=x.device, dtype=torch.int32)
            start += back.shape[0]
        backs = [back for _, back, _ in combines]
        out = combine(backs[0] if len(backs) == 1 else torch.cat(backs), pos.view(ids.shape), weights, use_triton)
        timer.lap("combine")
        return out

    def _padded_exchange(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, use_triton: bool, timer: _PhaseTimer
    ) -> torch.Tensor:
        """The exchange without any wait for the host (padded_tokens set): every rank sends every rank a block of
        P = padded_tokens * k rows, room for all of its pairs, the pairs bound there first and zero rows after
        them, with each row's local expert (-1 for the padding, which the experts skip). Equal, fixed split sizes
        need no counts on the host; the price is ws * P rows on the wire, which suits decode-sized calls."""
        (T, k), dev, H = ids.shape, ids.device, x.shape[1]
        ws, n_local, P = self.world_size, self.local_experts, self.padded_tokens * ids.shape[1]
        if T > self.padded_tokens:
            raise ValueError(f"EPMoE: {T} tokens on rank {self.rank} exceed padded_tokens={self.padded_tokens}")
        flat = ids.reshape(-1)
        dest = torch.where(flat >= 0, flat // n_local, ws)  # a dropped pair: "rank" ws, past the blocks
        order = torch.argsort(dest, stable=True)
        counts = torch.zeros(ws + 1, device=dev, dtype=torch.int64).scatter_add_(0, dest, torch.ones_like(dest))
        sorted_dest = dest[order]
        start = torch.cumsum(counts, 0) - counts
        row = sorted_dest * P + torch.arange(T * k, device=dev) - start[sorted_dest]  # its row in the send blocks
        row = torch.where(sorted_dest < ws, row, ws * P)  # dropped pairs: one spare row, not sent
        send = x.new_zeros(ws * P + 1, H)
        send[row] = x[order // k]
        send_ids = torch.full((ws * P + 1,), -1, device=dev, dtype=torch.int32)
        send_ids[row] = (flat[order] % n_local).to(torch.int32)
        pos = torch.full((T * k,), -1, device=dev, dtype=torch.int32)  # (token, slot) -> its row coming back
        pos[order] = torch.where(sorted_dest < ws, row, -1).to(torch.int32)
        timer.lap("plan")
        recv, recv_ids = x.new_empty(ws * P, H), torch.empty(ws * P, device=dev, dtype=torch.int32)
        dist.all_to_all_single(recv_ids, send_ids[: ws * P], group=self.group)
        dist.all_to_all_single(recv, send[: ws * P], group=self.group)
        timer.lap("dispatch")
        unit = torch.ones(ws * P, 1, device=dev, dtype=torch.float32)
        y = self._experts(recv, recv_ids[:, None].long(), unit, use_triton)
        timer.lap("compute")
        back = x.new_empty(ws * P, H)
        dist.all_to_all_single(back, y, group=self.group)
        out = combine(back, pos.view(T, k), weights, use_triton)
        timer.lap("combine")
        return out

    def _peer_exchange(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, use_triton: bool, timer: _PhaseTimer
    ) -> torch.Tensor:
        """The exchange through the GPUs' memory (peer_tokens set; see peer_exchange's docstring)."""
        if not x.is_cuda:
            raise ValueError("EPMoE: peer_tokens needs CUDA tensors (symmetric memory); use padded_tokens on CPU")
        if x.shape[0] > self.peer_tokens:
            raise ValueError(f"EPMoE: {x.shape[0]} tokens on rank {self.rank} exceed peer_tokens={self.peer_tokens}")
        halves = self._peer_overlap()
        tokens = (self.peer_tokens + 1) // 2 if halves else self.peer_tokens  # (the most a half holds)
        if x.dtype not in self._peers:  # the buffers of another dtype stay: graphs captured with them replay them
            shapes = PeerExchange.shapes(self.world_size, self.top_k, tokens, x.shape[1], x.dtype)
            self._peers[x.dtype] = tuple(
                PeerExchange(PeerBuffers.symmetric(shapes, self.group, x.device, slot, self._timeout_ms),
                             self.num_experts, self.top_k, tokens) for slot in range(2 if halves else 1))  # fmt: skip
        exchanges, experts = self._peers[x.dtype], self._experts_on_rows(use_triton, tokens)
        if halves:
            return run_peer_exchange_overlapped(exchanges, x, ids, weights, experts, use_triton, timer)
        return run_peer_exchange(exchanges[0], x, ids, weights, experts, use_triton, timer)

    def _peer_overlap(self) -> bool:
        """Whether the peer exchange splits calls in two halves (the same decision on every rank: from the
        layer's arguments, not from this call's tokens)."""
        return self.overlap is True or (self.overlap == "auto" and self.peer_tokens >= OVERLAP_MIN_TOKENS)

    def _experts_on_rows(self, use_triton: bool, tokens: int):
        """experts(rows [n, H], local expert ids [n, k] (-1: none), weights [n, k]) -> [n, H]: fused_moe (or the
        loop over experts) on this rank's experts. The receive buffer has room for ws times the rows a rank
        receives on average, so fused_moe's tiles are chosen for that average (`tokens` * k pairs, the most
        tokens a rank sends in one exchange), not for the buffer's size."""
        config = default_config(tokens * self.top_k, self.local_experts, self.w_down.dtype, self.w_down.device)

        def experts(rows: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            if not use_triton:
                return self._experts(rows, ids, weights, use_triton)
            return fused_moe(rows, self.w_gate_up, self.w_down, ids, weights, config=config)

        return experts

    def _plan(self, ids: torch.Tensor, weights: torch.Tensor) -> list[_Exchange]:
        """Sort the kept (token, slot) pairs by (expert, half of the tokens) and exchange the counts per (expert,
        half), with each rank's overlap vote appended. One _Exchange, or one per half if every rank voted yes."""
        (T, k), dev = ids.shape, ids.device
        ws, n_local, E = self.world_size, self.local_experts, self.num_experts
        # every (token, slot) pair, keyed by (expert, half of the tokens); a dropped one (id -1) sorts last
        tok = torch.arange(T, device=dev).repeat_interleave(k)
        flat = ids.reshape(-1)
        key = torch.where(flat >= 0, flat * 2 + (tok >= (T + 1) // 2), 2 * E)
        order = torch.argsort(key, stable=True)
        vote = T >= OVERLAP_MIN_TOKENS if self.overlap == "auto" else self.overlap
        # (not torch.bincount: on CUDA it reads the largest key back to the host first, a second wait)
        counts = torch.zeros(2 * E + 1, device=dev, dtype=torch.int64).scatter_add_(0, key, torch.ones_like(key))
        counts = counts[: 2 * E].view(ws, 2 * n_local)
        send = torch.cat([counts, torch.full((ws, 1), int(vote), device=dev, dtype=counts.dtype)], 1)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        recv_dev = recv[:, :-1].reshape(ws, n_local, 2)
        send, recv = torch.stack([send, recv]).cpu().unbind(0)  # the one host sync: split sizes
        send_counts, recv_counts = (c[:, :-1].reshape(ws, n_local, 2) for c in (send, recv))
        order = order[: int(send_counts.sum())]  # the kept pairs, sorted
        tok, key = tok[order], key[order]
        local = torch.arange(n_local, device=dev).repeat(ws)

        def exchange(sel: torch.Tensor | slice, sent: torch.Tensor, received: torch.Tensor, rows: torch.Tensor) -> _Exchange:
            """sent / received: [ws, n_local] rows per (rank, local expert) on the host, rows: received on the
            device (the received rows' local experts are built there: a host-side repeat_interleave of
            thousands of rows cost ~5 ms a call on the GPU host)."""
            total = int(received.sum())
            experts = local.repeat_interleave(rows.flatten(), output_size=total)
            return _Exchange(tok[sel], order[sel], sent.sum(1).tolist(), received.sum(1).tolist(), experts)

        if not bool(recv[:, -1].all()):
            return [exchange(slice(None), send_counts.sum(2), recv_counts.sum(2), recv_dev.sum(2))]
        by_half = torch.argsort(key % 2, stable=True)  # (not a boolean mask: selecting by one waits for the GPU)
        first = int(send_counts[..., 0].sum())
        halves = (by_half[:first], by_half[first:])
        return [exchange(halves[h], send_counts[..., h], recv_counts[..., h], recv_dev[..., h]) for h in (0, 1)]
