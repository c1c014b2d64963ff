"""The expert-parallel exchange through the GPUs' memory: rows written straight into the other ranks' buffers.

EPMoE's NCCL exchange needs each pair's row count on the host before `all_to_all_single` can move the rows, so
every call waits for the GPU once, with every rank's arrival skew in the wait (~1.2 ms a call on 4 H100s, at
128 tokens as at 4096). Here the counts stay on the GPUs. Every rank holds three buffers of the same shapes
(CUDA symmetric memory: each GPU can address the others' over NVLink):

    counts [ws, E]          int32   row s: the kept pairs rank s sends to each global expert
    recv   [ws * P * k, H]  x.dtype the rows this rank's experts receive, grouped by local expert, then source
    back   [P * k, H]       x.dtype the expert outputs of this rank's pairs, in this rank's sorted order

(P: the most tokens any rank passes in one call, k: top-k). One call is four steps with a barrier between
consecutive steps (a kernel on the stream: every rank's earlier kernels have finished, and their writes are
visible, before any rank goes on):
  1. sort this rank's kept (token, slot) pairs by global expert (so by owner, then local expert) and write the
     per-expert counts into row `rank` of every rank's `counts`;
  2. from the whole count table, each pair's row in its owner's `recv` (expert-major, so the owner's rows of one
     expert are contiguous, sources in rank order); write the token rows there;
  3. the owner runs its experts over `recv` (rows past the received ones tagged expert -1, skipped) and writes
     each result into the sender's `back` at the pair's index in the sender's sorted order, which it computes
     from the same count table;
  4. the sender sums each token's k rows of `back` scaled by its routing weights (`combine`).
Three barriers make reuse safe across calls: a buffer is written in step i of one call only after every rank
has finished reading it in the previous call (`counts` is read in steps 2-3, `recv` in 3, `back` in 4). No
step waits for the host, so the exchange can be captured in a CUDA graph. The price: `recv` holds room for the
worst case (every rank's pairs to one rank), and the experts run over that many rows, most of them padding
that exits at once.

`PeerBuffers` hides where the buffers live: `symmetric` (CUDA symmetric memory over a process group) or `local`
(all ranks' buffers in one process, for tests that run the ranks' steps in turn on a CPU).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import launch, next_pow2


@triton.jit
def _put_rows_kernel(src_ptr, rows_ptr, dest_rank_ptr, dest_pos_ptr, table_ptr, H, stride_src,
                     BLOCK_H: tl.constexpr):
    """Row i: buffer of rank dest_rank[i] (its address: table[dest_rank[i]]) [dest_pos[i], :] = src[rows[i], :];
    nothing where dest_pos[i] < 0."""
    i = tl.program_id(0)
    pos = tl.load(dest_pos_ptr + i).to(tl.int64)
    if pos >= 0:
        dest = tl.load(table_ptr + tl.load(dest_rank_ptr + i)).to(tl.pointer_type(src_ptr.dtype.element_ty))
        row = tl.load(rows_ptr + i).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        inside = cols < H
        tl.store(dest + pos * H + cols, tl.load(src_ptr + row * stride_src + cols, mask=inside), mask=inside)


@dataclass
class PeerBuffers:
    """This rank's view of buffers every rank holds with the same shapes. `tables[name]`: int64 [ws] on the
    device, each rank's address of that buffer; `peer(name, r)`: rank r's buffer as a tensor (through the
    peer mapping on CUDA); `barrier()`: every rank's earlier work (stream order) is done and visible."""

    rank: int
    world_size: int
    own: dict[str, torch.Tensor]
    tables: dict[str, torch.Tensor]
    peer: Callable[[str, int], torch.Tensor]
    barrier: Callable[[], None]

    @staticmethod
    def symmetric(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], group, device: torch.device) -> PeerBuffers:
        """CUDA symmetric memory over `group` (a collective: every rank calls it with the same shapes)."""
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.9 (deprecated, a no-op, later)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable(group.group_name)
        own, handles, tables = {}, {}, {}
        for name, (shape, dtype) in shapes.items():
            own[name] = symm_mem.empty(*shape, dtype=dtype, device=device)
            handles[name] = symm_mem.rendezvous(own[name], group.group_name)
            offset = own[name].data_ptr() - handles[name].buffer_ptrs[handles[name].rank]
            tables[name] = torch.tensor([p + offset for p in handles[name].buffer_ptrs], dtype=torch.int64,
                                        device=device)
        first = handles[next(iter(shapes))]

        def peer(name: str, r: int) -> torch.Tensor:
            return handles[name].get_buffer(r, own[name].shape, own[name].dtype)

        return PeerBuffers(first.rank, first.world_size, own, tables, peer, lambda: first.barrier(channel=0))

    @staticmethod
    def local(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], world_size: int,
              device: torch.device | str = "cpu") -> list[PeerBuffers]:
        """Every rank's buffers in this process (tests run the ranks' steps in turn); barrier does nothing."""
        bufs = [{n: torch.zeros(s, dtype=d, device=device) for n, (s, d) in shapes.items()} for _ in range(world_size)]
        tables = {n: torch.tensor([b[n].data_ptr() for b in bufs], dtype=torch.int64, device=device) for n in shapes}
        return [PeerBuffers(r, world_size, bufs[r], tables, lambda n, q: bufs[q][n], lambda: None)
                for r in range(world_size)]

    def put_rows(self, name: str, src: torch.Tensor, rows: torch.Tensor, dest_rank: torch.Tensor,
                 dest_pos: torch.Tensor, use_triton: bool) -> None:
        """For each i: rank dest_rank[i]'s buffer `name` [dest_pos[i]] = src[rows[i]] (skipped where dest_pos[i]
        < 0). One Triton kernel storing through the address table, or torch index copies per rank."""
        n, H = rows.numel(), src.shape[1]
        if n == 0:
            return
        if use_triton:
            block = min(2048, next_pow2(H))
            launch(_put_rows_kernel, (n, triton.cdiv(H, block)), src.device, src, rows.contiguous(),
                   dest_rank.contiguous(), dest_pos.contiguous(), self.tables[name], H, src.stride(0),
                   BLOCK_H=block, num_warps=4)
            return
        for r in range(self.world_size):
            sel = (dest_rank == r) & (dest_pos >= 0)
            self.peer(name, r)[dest_pos[sel].long()] = src[rows[sel].long()]


def _exclusive_cumsum(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.cumsum(t, dim) - t


@dataclass
class _Sends:
    """Step 1's result, on this rank. order: the pairs t * k + s sorted by global expert (dropped last); key:
    their experts (E for dropped); starts: exclusive prefix of this rank's counts per expert."""

    order: torch.Tensor
    key: torch.Tensor
    starts: torch.Tensor


class PeerExchange:
    """EPMoE's dispatch, expert computation and combine through `PeerBuffers` (see the module docstring).
    experts(rows [n, H], local expert ids [n] (-1: skip), ends [n_local] int32: each expert's end row) -> [n, H]
    runs this rank's experts (the rows come grouped by expert: ids and ends say the same)."""

    def __init__(self, buffers: PeerBuffers, num_experts: int, top_k: int, max_tokens: int) -> None:
        self.buffers, self.num_experts, self.top_k, self.max_tokens = buffers, num_experts, top_k, max_tokens
        self.local_experts = num_experts // buffers.world_size

    @staticmethod
    def shapes(world_size: int, num_experts: int, top_k: int, max_tokens: int, hidden: int,
               dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        rows = max_tokens * top_k
        return {"counts": ((world_size, num_experts), torch.int32), "recv": ((world_size * rows, hidden), dtype),
                "back": ((rows, hidden), dtype)}

    def send_counts(self, ids: torch.Tensor, use_triton: bool) -> _Sends:
        """Step 1: sort the kept pairs by expert; this rank's counts into row `rank` of every rank's table."""
        E, b = self.num_experts, self.buffers
        if ids.shape[0] > self.max_tokens:
            raise ValueError(f"EPMoE: {ids.shape[0]} tokens on rank {b.rank} exceed peer_tokens={self.max_tokens}")
        flat = ids.reshape(-1).long()
        key = torch.where(flat >= 0, flat, E)
        order = torch.argsort(key, stable=True)
        counts = torch.zeros(E + 1, device=ids.device, dtype=torch.int32).scatter_add_(
            0, key, torch.ones_like(key, dtype=torch.int32))[:E]
        everyone = torch.arange(b.world_size, device=ids.device)
        b.put_rows("counts", counts[None], torch.zeros_like(everyone), everyone, torch.full_like(everyone, b.rank),
                   use_triton)
        return _Sends(order, key[order], _exclusive_cumsum(counts.long()))

    def _table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The count table [src, dst, local expert] and each destination's expert-major row starts [dst, e, src]
        (exclusive prefix over (e, src))."""
        ws, n_local = self.buffers.world_size, self.local_experts
        table = self.buffers.own["counts"].long().view(ws, ws, n_local)
        by_dst = table.permute(1, 2, 0).reshape(ws, n_local * ws)
        return table, _exclusive_cumsum(by_dst).view(ws, n_local, ws)

    def send_rows(self, x: torch.Tensor, sends: _Sends, use_triton: bool) -> torch.Tensor:
        """Step 2: each kept pair's token row into its owner's `recv`; returns pos [T * k]: each pair's row in
        `back` (its index in this rank's sorted order), -1 for a dropped pair."""
        E, k, b = self.num_experts, self.top_k, self.buffers
        _, starts = self._table()
        mine = starts[:, :, b.rank].reshape(E)  # where this rank's rows of each global expert start at its owner
        kept = sends.key < E
        expert = sends.key.clamp(max=E - 1)
        index = torch.arange(sends.order.numel(), device=x.device)
        dest_pos = torch.where(kept, mine[expert] + index - sends.starts[expert], -1)
        b.put_rows("recv", x, sends.order // k, expert // self.local_experts, dest_pos, use_triton)
        pos = torch.empty_like(index, dtype=torch.int32)
        pos[sends.order] = torch.where(kept, index, -1).to(torch.int32)
        return pos

    def compute_and_return(self, experts: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                           use_triton: bool) -> None:
        """Step 3: this rank's experts over `recv`; each result into its sender's `back`."""
        b, ws, n_local = self.buffers, self.buffers.world_size, self.local_experts
        table, starts = self._table()
        sizes = table[:, b.rank, :].T.reshape(-1)  # rows per (local expert, source), expert-major
        group_start = starts[b.rank].reshape(-1)
        recv = b.own["recv"]
        p = torch.arange(recv.shape[0], device=recv.device)
        group = torch.searchsorted(group_start + sizes, p, right=True).clamp(max=n_local * ws - 1)
        valid = p < sizes.sum()
        expert, source = group // ws, group % ws
        # the row's index in its sender's sorted order: the sender's pairs of lower global experts, then its rank
        sender_starts = _exclusive_cumsum(table.reshape(ws, -1))  # [src, global expert]
        back_pos = sender_starts[source, b.rank * n_local + expert] + p - group_start[group]
        ends = torch.cumsum(sizes.view(n_local, ws).sum(1), 0).to(torch.int32)  # each local expert's end row
        y = experts(recv, torch.where(valid, expert, -1), ends)
        b.put_rows("back", y, p, source, torch.where(valid, back_pos, -1), use_triton)
