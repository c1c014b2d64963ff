"""The expert-parallel exchange through the GPUs' memory: rows written straight into the other ranks' buffers.

EPMoE's NCCL exchange needs each pair's row count on the host before `all_to_all_single` can move the rows, so
every call waits for the GPU once, with every rank's arrival skew in the wait (~1.2 ms a call on 4 H100s, at
128 tokens as at 4096). Here the counts stay on the GPUs, and a token travels once to each rank that holds any
of its experts (not once per expert: with DeepSeek-like top-6 of 64 experts on 4 ranks that is 3.3 rows a token
instead of 6). Every rank holds four buffers of the same shapes (CUDA symmetric memory: each GPU addresses the
others' over NVLink); P is the most tokens any rank passes in one call, k the top-k:

    counts [ws, ws]          int32   row s: the tokens rank s sends to each rank
    recv   [ws * P, H]       x.dtype the token rows this rank's experts receive, by source rank, then token order
    meta   [ws * P, 2k + 1]  int64   per received row: its k local expert ids (-1: not here), its k routing
                                     weights (float64 bits) and its token index at the sender
    back   [ws * P, H]       x.dtype row d * P + t: rank d's weighted sum of token t's expert outputs

One call is four steps with a barrier between consecutive steps (a kernel on the stream: every rank's earlier
kernels have finished, and their writes are visible, before any rank goes on):
  1. find the ranks each token goes to; write this rank's token counts into row `rank` of every `counts`;
  2. from the whole count table, each (token, rank) row's place in that rank's `recv`; write the token rows and
     their meta rows there;
  3. the owner runs its experts over the received rows (fused_moe: rows past the received ones get no expert),
     sums each row's expert outputs with its routing weights, and writes that partial sum into the sender's
     `back` at row owner * P + token;
  4. the sender adds each token's partial sums (`combine`, float32).
Three barriers make reuse safe across calls: a buffer is written in step i of one call only after every rank
has finished reading it in the previous call (`counts` is read in steps 2-3, `recv` and `meta` in 3, `back` in
4). The barriers order one stream: every call must come on the same stream. With the Triton kernels no step
waits for the host, so the exchange can be captured in a CUDA graph (the torch path of `put_rows` selects rows
by masks, which waits). The price: `recv` has room for the worst case (every rank's tokens to one rank), and
the experts run over all of its rows (those past the received ones have no expert and exit at once).

Overlapped (EPMoE's `overlap` with `peer_tokens`; `run_peer_exchange_overlapped`), a call splits its tokens in two
halves, each with its own set of buffers (a `slot`: room for half the tokens, its own barrier channel). A second
stream moves the halves (steps 1-2 of each, then each half's partial sums back) while the call's stream runs the
experts: the second half's rows travel while the first half's experts run, and the first half's sums travel
while the second half's experts run. Each set keeps the three barriers of one call, so reuse stays safe.

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
def _put_rows_kernel(src_ptr, rows_ptr, dest_rank_ptr, dest_pos_ptr, table_ptr, H, stride_src, stride_col,
                     BLOCK_H: tl.constexpr):
    """Row i: buffer of rank dest_rank[i] (its address: table[dest_rank[i]]) [dest_pos[i], :] = src[rows[i], :];
    nothing where dest_pos[i] < 0 (one program a row: most of a worst-case-sized buffer's rows exit at once)."""
    i = tl.program_id(0)
    pos = tl.load(dest_pos_ptr + i).to(tl.int64)
    if pos >= 0:
        dest = tl.load(table_ptr + tl.load(dest_rank_ptr + i)).to(tl.pointer_type(src_ptr.dtype.element_ty))
        row = tl.load(rows_ptr + i).to(tl.int64)
        for start in range(0, H, BLOCK_H):
            cols = start + tl.arange(0, BLOCK_H)
            inside = cols < H
            tl.store(dest + pos * H + cols, tl.load(src_ptr + row * stride_src + cols * stride_col, mask=inside),
                     mask=inside)


_SHARED: dict[tuple, PeerBuffers] = {}  # PeerBuffers.symmetric's sets, by group, device and shapes


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
    def symmetric(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], group, device: torch.device,
                  slot: int = 0, timeout_ms: int = 0) -> PeerBuffers:
        """CUDA symmetric memory over `group` (a collective: every rank calls it with the same shapes). One set
        per (group, device, shapes, slot) in a process: exchanges that run one after another on a stream (the
        layers of a model) share it, with the same barriers that make one exchange's consecutive calls safe.
        Exchanges in flight at the same time (the two halves of an overlapped call) take different slots: their
        own buffers, and their own barrier channel. `timeout_ms` (0: none): a barrier that waits longer for a
        rank stops the GPU with torch's "barrier timeout" message (the CUDA context is lost, the process fails)
        instead of spinning forever — a rank that died or skipped a call, as NCCL's watchdog would."""
        import torch.distributed as dist

        group = group or dist.group.WORLD
        key = (group.group_name, str(device), tuple((n, tuple(shape), dtype) for n, (shape, dtype) in shapes.items()),
               slot, timeout_ms)  # fmt: skip
        if key not in _SHARED:
            _SHARED[key] = PeerBuffers._allocate(shapes, group, device, slot, timeout_ms)
        return _SHARED[key]

    @staticmethod
    def _allocate(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], group, device: torch.device,
                  channel: int, timeout_ms: int = 0) -> PeerBuffers:
        import torch.distributed._symmetric_memory as symm_mem

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
            offset = (own[name].data_ptr() - handles[name].buffer_ptrs[handles[name].rank]) // own[name].element_size()
            return handles[name].get_buffer(r, own[name].shape, own[name].dtype, offset)

        return PeerBuffers(first.rank, first.world_size, own, tables, peer,
                           lambda: first.barrier(channel=channel, timeout_ms=timeout_ms))

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
            launch(_put_rows_kernel, (n,), src.device, src, rows.contiguous(),
                   dest_rank.contiguous(), dest_pos.contiguous(), self.tables[name], H, src.stride(0), src.stride(1),
                   BLOCK_H=block, num_warps=4)
            return
        for r in range(self.world_size):
            sel = (dest_rank == r) & (dest_pos >= 0)
            self.peer(name, r)[dest_pos[sel].long()] = src[rows[sel].long()]


def _exclusive_cumsum(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.cumsum(t, dim) - t


@dataclass
class _Sends:
    """Step 1's result on this rank: hit [T, ws] (token t has an expert on rank d) and each token's local expert
    ids [T, ws, k] (-1 where slot j's expert is elsewhere or dropped)."""

    hit: torch.Tensor
    local_ids: torch.Tensor


class PeerExchange:
    """EPMoE's dispatch, expert computation and combine through `PeerBuffers` (see the module docstring).
    experts(rows [n, H], local expert ids [n, k] (-1: none), weights [n, k]) -> [n, H] runs this rank's experts
    and sums each row's results scaled by its weights (fused_moe's contract)."""

    def __init__(self, buffers: PeerBuffers, num_experts: int, top_k: int, max_tokens: int) -> None:
        self.buffers, self.top_k, self.max_tokens = buffers, top_k, max_tokens
        self.local_experts = num_experts // buffers.world_size

    @staticmethod
    def shapes(world_size: int, top_k: int, max_tokens: int, hidden: int,
               dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        rows = world_size * max_tokens
        return {"counts": ((world_size, world_size), torch.int32), "recv": ((rows, hidden), dtype),
                "meta": ((rows, 2 * top_k + 1), torch.int64), "back": ((rows, hidden), dtype)}

    def send_counts(self, ids: torch.Tensor, use_triton: bool) -> _Sends:
        """Step 1: which ranks each token goes to; this rank's token counts into row `rank` of every rank's
        table."""
        b, n_local = self.buffers, self.local_experts
        if ids.shape[0] > self.max_tokens:
            raise ValueError(f"EPMoE: {ids.shape[0]} tokens on rank {b.rank} exceed peer_tokens={self.max_tokens}")
        ids = ids.long()
        ranks = torch.arange(b.world_size, device=ids.device)
        on = (ids[:, None, :] >= 0) & (ids[:, None, :] // n_local == ranks[None, :, None])  # [T, ws, k]
        hit = on.any(2)
        counts = hit.sum(0, dtype=torch.int32)
        b.put_rows("counts", counts[None], torch.zeros_like(ranks), ranks, torch.full_like(ranks, b.rank), use_triton)
        return _Sends(hit, torch.where(on, ids[:, None, :] % n_local, -1))

    def _token_starts(self) -> torch.Tensor:
        """[src, dst]: where src's rows start in dst's `recv` (sources in rank order)."""
        return _exclusive_cumsum(self.buffers.own["counts"].long(), 0)

    def send_rows(self, x: torch.Tensor, weights: torch.Tensor, sends: _Sends, use_triton: bool) -> torch.Tensor:
        """Step 2: each token's row, once per rank holding any of its experts, into that rank's `recv`, with a
        meta row (the local expert ids, the routing weights as float64 bits, the token index) into its `meta`;
        returns pos [T, ws]: the rows of this rank's `back` that will hold each rank's partial sum (-1: none)."""
        b, (T, k) = self.buffers, weights.shape
        ws = b.world_size
        # the token's place among rank d's rows, [T, ws]; scanned along the inner dim of the transpose: torch's
        # scan along dim 0 of [T, ws] runs one thread a column (0.65 ms a call at T = 4096 on an H100)
        rank_in_list = _exclusive_cumsum(sends.hit.T.long()).T
        dest_pos = torch.where(sends.hit, self._token_starts()[b.rank][None, :] + rank_in_list, -1)
        dest_rank = torch.arange(ws, device=x.device).expand(T, ws)
        token = torch.arange(T, device=x.device)
        b.put_rows("recv", x, token[:, None].expand(T, ws).reshape(-1), dest_rank.reshape(-1), dest_pos.reshape(-1),
                   use_triton)
        meta = torch.cat([sends.local_ids, weights.double()[:, None, :].expand(T, ws, k).contiguous().view(torch.int64),
                          token[:, None, None].expand(T, ws, 1)], 2).view(T * ws, 2 * k + 1)
        b.put_rows("meta", meta, torch.arange(T * ws, device=x.device), dest_rank.reshape(-1), dest_pos.reshape(-1),
                   use_triton)
        return torch.where(sends.hit, torch.arange(ws, device=x.device)[None, :] * self.max_tokens + token[:, None],
                           -1).to(torch.int32)

    def compute_and_return(self, experts: Callable, use_triton: bool) -> None:
        """Step 3: `compute`, then `send_back`."""
        self.send_back(self.compute(experts), use_triton)

    def compute(self, experts: Callable) -> _Computed:
        """Step 3's first half: this rank's experts over the received rows, each row's results summed with its
        weights; and where each partial sum goes, in the order the return stores them (`_senders_in_turn`)."""
        b, k = self.buffers, self.top_k
        total = self.buffers.own["counts"][:, b.rank].sum()
        recv, meta = b.own["recv"], b.own["meta"]
        row = torch.arange(recv.shape[0], device=recv.device)
        valid = row < total
        ids = torch.where(valid[:, None], meta[:, :k], -1)  # rows past the received ones hold earlier calls' data
        weights = meta[:, k : 2 * k].contiguous().view(torch.float64).to(torch.promote_types(recv.dtype, torch.float32))
        out = experts(recv, ids, weights)
        order = self._senders_in_turn(recv.shape[0])
        taken = order.clamp_min(0)
        back_pos = torch.where(order >= 0, b.rank * self.max_tokens + meta[taken, 2 * k].long(), -1)
        return _Computed(out, taken, row % b.world_size, back_pos)

    def send_back(self, done: _Computed, use_triton: bool) -> None:
        """Step 3's second half: each partial sum into its sender's `back` (row rank * max_tokens + token)."""
        self.buffers.put_rows("back", done.out, done.row, done.source, done.back_pos, use_triton)

    def _senders_in_turn(self, rows: int) -> torch.Tensor:
        """[rows]: the received row put program i stores (-1: none), going round the senders: sender i % ws's
        row i // ws (the j-th row of sender 0, of sender 1, ..., then the (j+1)-th), so that programs running
        side by side store over every link rather than over one sender's at a time (the received rows lie sender
        by sender)."""
        b = self.buffers
        ws = b.world_size
        counts = b.own["counts"][:, b.rank].long()
        i = torch.arange(rows, device=counts.device)
        sender, j = i % ws, i // ws
        return torch.where(j < counts[sender], self._token_starts()[:, b.rank][sender] + j, -1)


@dataclass
class _Computed:
    """`PeerExchange.compute`'s result: the partial sums [rows, H] and, per put program of the return, the
    received row it stores, that row's sender and its row in the sender's `back` (-1: nothing to store)."""

    out: torch.Tensor
    row: torch.Tensor
    source: torch.Tensor
    back_pos: torch.Tensor
