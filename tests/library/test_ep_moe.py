"""EPMoE (dlblas_compiler/library/ep_moe.py) against moe_reference.

Multi-rank cases run on CPU over gloo, one torch.multiprocessing.spawn per world size (2 and 4) running all its
cases; each rank checks its own output against moe_reference on its own token shard (EPMoE routes, and applies
the capacity, per rank). The reference backend in float64 matches to 1e-10; the Triton kernels (interpreter,
float32, exact fp32 dots) to 1e-4 absolute / relative."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlblas_compiler.library import EPMoE, moe_reference
from dlblas_compiler.library.ep_moe import router_logits
from dlblas_compiler.library.gating import topk_gating_reference

START = time.perf_counter()
F64_TOL = {"rtol": 1e-10, "atol": 1e-10}
F32_TOL = {"rtol": 1e-4, "atol": 1e-4}
E, H, INTER, TOP_K = 8, 16, 24, 2


def _weights(seed: int, dtype: torch.dtype = torch.float64, experts: int = E) -> tuple[torch.Tensor, ...]:
    """(router [E, H], w_gate_up [E, 2I, H], w_down [E, H, I]), the same on every rank. Router column 0 is 0:
    tests bias it, with x[:, 0] = 1."""
    g = torch.Generator().manual_seed(seed)
    router = torch.randn(experts, H, generator=g, dtype=dtype) / H**0.5
    router[:, 0] = 0
    w_gate_up = torch.randn(experts, 2 * INTER, H, generator=g, dtype=dtype) / H**0.5
    w_down = torch.randn(experts, H, INTER, generator=g, dtype=dtype) / INTER**0.5
    return router, w_gate_up, w_down


def _tokens(seed: int, tokens: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    x[:, 0] = 1.0  # the router's bias feature
    return x


def _experts_hit(x: torch.Tensor, router: torch.Tensor, capacity_factor: float | None) -> torch.Tensor:
    """[E] kept assignments per expert when x is routed as one rank's tokens."""
    ids = topk_gating_reference(router_logits(x, router), TOP_K, capacity_factor).ids
    return torch.bincount(ids[ids >= 0], minlength=router.shape[0])


def _check_case(rank: int, ws: int, name: str, bias: torch.Tensor, tokens: int, **kwargs: object) -> None:
    """EPMoE on rank's shard vs moe_reference on it; router column 0 (with x[:, 0] = 1) set to `bias`."""
    router, w_gate_up, w_down = _weights(seed=1)
    router[:, 0] = bias
    shards = [_tokens(100 + r, tokens) for r in range(ws)]
    layer = EPMoE(router, w_gate_up, w_down, TOP_K, backend="reference", **kwargs)
    out = layer(shards[rank])
    ref = moe_reference(shards[rank], router, w_gate_up, w_down, TOP_K, kwargs.get("capacity_factor"))
    torch.testing.assert_close(out, ref, **F64_TOL, msg=lambda m: f"{name}, rank {rank}/{ws}: {m}")


def _cases(rank: int, ws: int) -> None:
    per_rank = E // ws
    owner = torch.arange(E) // per_rank
    no_bias = torch.zeros(E, dtype=torch.float64)

    # (a) capacity drops: each rank drops some assignments
    router = _weights(seed=1)[0]
    x = _tokens(100 + rank, 48)
    kept = _experts_hit(x, router, 0.5).sum()
    assert 0 < kept < 48 * TOP_K, f"capacity case drops nothing (kept {kept})"
    _check_case(rank, ws, "capacity", no_bias, 48, capacity_factor=0.5, overlap=False)
    _check_case(rank, ws, "capacity, padded blocks", no_bias, 48, capacity_factor=0.5, padded_tokens=64)

    # (b) uneven: rank 0's experts take over half the assignments, the other ranks still some
    uneven = 1.5 * (owner == 0).double()
    router[:, 0] = uneven
    load = torch.stack([_experts_hit(_tokens(100 + r, 40), router, None) for r in range(ws)]).sum(0)
    by_rank = load.view(ws, per_rank).sum(1)
    assert by_rank[0] > 0.5 * by_rank.sum() and (by_rank[1:] > 0).all(), by_rank
    _check_case(rank, ws, "uneven", uneven, 40, overlap=False)
    _check_case(rank, ws, "uneven + capacity", uneven, 40, capacity_factor=1.0, overlap=True)
    _check_case(rank, ws, "uneven, padded blocks", uneven, 40, padded_tokens=40)

    # (c) the last rank receives no token
    starved = -20.0 * (owner == ws - 1).double()
    router[:, 0] = starved
    load = torch.stack([_experts_hit(_tokens(100 + r, 40), router, None) for r in range(ws)]).sum(0)
    assert load.view(ws, per_rank)[-1].sum() == 0, load
    _check_case(rank, ws, "starved rank", starved, 40, overlap=False)
    _check_case(rank, ws, "starved rank, overlap", starved, 40, overlap=True)
    _check_case(rank, ws, "starved rank, padded blocks", starved, 40, padded_tokens=40)

    # (d) overlap on vs off; with different token counts per rank "auto" must agree (rank 0 alone votes yes)
    router, w_gate_up, w_down = _weights(seed=2)
    x = _tokens(200 + rank, 1100 if rank == 0 else 24 + 8 * rank)
    outs = [EPMoE(router, w_gate_up, w_down, TOP_K, backend="reference", overlap=o)(x) for o in (False, True, "auto")]
    torch.testing.assert_close(outs[1], outs[0], **F64_TOL)
    torch.testing.assert_close(outs[2], outs[0], **F64_TOL)
    padded = EPMoE(router, w_gate_up, w_down, TOP_K, backend="reference", padded_tokens=1100)(x)  # ranks' T differ
    torch.testing.assert_close(padded, outs[0], **F64_TOL)
    torch.testing.assert_close(outs[0], moe_reference(x, router, w_gate_up, w_down, TOP_K), **F64_TOL)

    _check_moe_step_follows_weight_updates(rank, ws)

    if ws == 4:  # experts must split evenly over the ranks
        with pytest.raises(ValueError, match="6 experts do not split evenly over 4 ranks"):
            EPMoE(*_weights(seed=4, experts=6), TOP_K)
        return

    # (ws 2 only, the interpreter is slow) [B, S, H] input, timings, the Triton kernels with k = 1 on received rows
    router, w_gate_up, w_down = (w.float() for w in _weights(seed=3))
    x = _tokens(300 + rank, 16, torch.float32).view(2, 8, H)
    timings: dict[str, float] = {}
    out = EPMoE(router, w_gate_up, w_down, TOP_K, backend="triton", overlap=True)(x, timings=timings)
    ref = moe_reference(x.double(), router.double(), w_gate_up.double(), w_down.double(), TOP_K)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    assert set(timings) == {"route", "plan", "dispatch", "compute", "combine", "total"}
    padded = EPMoE(router, w_gate_up, w_down, TOP_K, backend="triton", padded_tokens=20)(x, timings=timings)
    torch.testing.assert_close(padded.double(), ref, **F32_TOL)  # padding rows (expert -1) skipped by fused_moe
    assert set(timings) == {"route", "plan", "dispatch", "compute", "combine", "total"}


def _check_moe_step_follows_weight_updates(rank: int, ws: int) -> None:
    """The compiled program's dl.moe step over a group (MoEStep) builds EPMoE once, which keeps copies of this rank's
    experts when ws > 1; it rebuilt it only for other weight tensors, so in-place updates after the first call
    (load_state_dict, an optimizer step) were silently ignored. It now follows them, and `p.data = t`."""
    from dlblas_compiler.library.moe_step import MoEStep

    router, w_gate_up, w_down = _weights(seed=9)
    x = _tokens(900 + rank, 12)
    step = MoEStep([0, 1, 2, 3], 4, TOP_K, True, group=dist.group.WORLD, backend="reference")
    env = [x, router, w_gate_up, w_down, None]
    for update in (lambda: None, lambda: w_gate_up.mul_(1.5), lambda: setattr(w_down, "data", w_down * 0.5)):
        update()
        step(env)
        ref = moe_reference(x, router, w_gate_up, w_down, TOP_K)
        torch.testing.assert_close(env[4], ref, **F64_TOL, msg=lambda m: f"MoEStep, rank {rank}/{ws}: {m}")
    assert len(step._layer) == 1


def _worker(rank: int, ws: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=ws)
    try:
        _cases(rank, ws)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", [2, 4])
def test_ep_moe_multi_rank(ws: int, tmp_path) -> None:
    mp.spawn(_worker, args=(ws, str(tmp_path / "init")), nprocs=ws)


def test_ep_moe_single_process() -> None:
    router, w_gate_up, w_down = _weights(seed=5)
    x = _tokens(6, 32).view(4, 8, H)
    layer = EPMoE(router, w_gate_up, w_down, TOP_K, capacity_factor=0.75)  # "auto": the reference on CPU
    assert (layer.world_size, layer.local_experts) == (1, E)
    torch.testing.assert_close(layer(x), moe_reference(x, router, w_gate_up, w_down, TOP_K, 0.75), **F64_TOL)
    assert layer.last_aux_loss is not None and layer.last_aux_loss.item() > 0


def test_ep_moe_triton_interpreter() -> None:
    """backend="triton" on CPU (interpreter), E=4, H=32, I=64, T=16, float32, vs the float64 reference."""
    g = torch.Generator().manual_seed(7)
    router = torch.randn(4, 32, generator=g)
    w_gate_up = torch.randn(4, 128, 32, generator=g) / 32**0.5
    w_down = torch.randn(4, 32, 64, generator=g) / 64**0.5
    x = torch.randn(16, 32, generator=g)
    out = EPMoE(router, w_gate_up, w_down, 2, capacity_factor=1.0, backend="triton")(x)
    ref = moe_reference(x.double(), router.double(), w_gate_up.double(), w_down.double(), 2, 1.0)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)


def test_ep_moe_triton_transposed_tokens() -> None:
    """x a transposed view: fused_moe's output took x's strides and its sum kernel wrote it as if row-major."""
    router, w_gate_up, w_down = (w.float() for w in _weights(seed=10))
    x = _tokens(11, 9, torch.float32).t().contiguous().t()
    out = EPMoE(router, w_gate_up, w_down, TOP_K, backend="triton")(x)
    ref = moe_reference(x.double(), router.double(), w_gate_up.double(), w_down.double(), TOP_K)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)


def test_ep_moe_bad_arguments() -> None:
    router, w_gate_up, w_down = _weights(seed=8)
    for bad in (0, -1.0, True, "60"):
        with pytest.raises(ValueError, match="barrier_timeout_s"):
            EPMoE(router, w_gate_up, w_down, TOP_K, barrier_timeout_s=bad)
    with pytest.raises(ValueError, match="backend"):
        EPMoE(router, w_gate_up, w_down, TOP_K, backend="cuda")
    with pytest.raises(ValueError, match="overlap"):
        EPMoE(router, w_gate_up, w_down, TOP_K, overlap="yes")
    with pytest.raises(ValueError, match="w_gate_up"):
        EPMoE(router, w_gate_up[:, :INTER], w_down, TOP_K)


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton-interpreter"])
def test_combine_sums_each_tokens_rows_scaled_by_its_weights(use_triton: bool) -> None:
    """combine: out[t] = sum_s w[t, s] * back[pos[t, s]] in float32, a dropped slot (pos -1) skipped; against
    the float64 loop."""
    from dlblas_compiler.library.ep_moe import combine

    g = torch.Generator().manual_seed(0)
    T, k, H = 7, 3, 40
    back = torch.randn(T * k - 4, H, generator=g).to(torch.bfloat16)
    pos = torch.randperm(T * k, generator=g).view(T, k).int()
    pos[pos >= back.shape[0]] = -1  # four dropped slots
    pos[2] = -1  # a token with no rows left: 0
    w = torch.rand(T, k, generator=g)
    pos[pos == 0] = -1  # row 0, which a dropped slot's index clamps to, is one that no slot points at
    unused = torch.ones(back.shape[0], dtype=torch.bool)  # rows no slot points at may hold anything
    unused[pos[pos >= 0].long()] = False
    back[unused] = float("nan")
    out = combine(back, pos, w, use_triton)
    assert out.isfinite().all()
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for s in range(k):
            if pos[t, s] >= 0:
                ref[t] += w[t, s].double() * back[pos[t, s]].double()
    assert out.dtype == torch.bfloat16 and torch.equal(out[2], torch.zeros(H, dtype=torch.bfloat16))
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)


def _simulate_peer_exchange(ws: int, shards: list[torch.Tensor], weights: tuple[torch.Tensor, ...], max_tokens: int,
                            use_triton: bool, capacity_factor: float | None = None,
                            buffers: list | None = None, impl: str | None = None) -> list[torch.Tensor]:
    """EPMoE's exchange through peer buffers with ws ranks in this process: every rank's step 1, then every
    rank's step 2, ... (what the barriers enforce on GPUs), with the buffers of `PeerBuffers.local`."""
    from dlblas_compiler.library.ep_moe import combine
    from dlblas_compiler.library.moe_gemm import fused_moe, fused_moe_reference
    from dlblas_compiler.library.peer_exchange import PeerBuffers, PeerExchange

    router, w_gate_up, w_down = weights
    n_local = router.shape[0] // ws
    kw = {"config": {"IMPL": impl}} if impl else {}
    routes = [topk_gating_reference(router_logits(x, router), TOP_K, capacity_factor) for x in shards]
    if buffers is None:
        shapes = PeerExchange.shapes(ws, TOP_K, max_tokens, H, shards[0].dtype)
        buffers = PeerBuffers.local(shapes, ws)
    exchanges = [PeerExchange(buffers[r], router.shape[0], TOP_K, max_tokens) for r in range(ws)]

    def experts_of(r: int):
        part = slice(r * n_local, (r + 1) * n_local)
        moe = fused_moe if use_triton else fused_moe_reference
        return lambda rows, ids, w: moe(rows, w_gate_up[part], w_down[part], ids, w, **kw)

    sends = [ex.send_counts(route.ids, use_triton) for ex, route in zip(exchanges, routes, strict=True)]
    pos = [ex.send_rows(x, route.weights, s, use_triton)
           for ex, x, route, s in zip(exchanges, shards, routes, sends, strict=True)]
    for r, ex in enumerate(exchanges):
        ex.compute_and_return(experts_of(r), use_triton)
    return [combine(buffers[r].own["back"], p, torch.ones(p.shape), use_triton) for r, p in enumerate(pos)]


def _poisoned_buffers(ws: int, max_tokens: int, dtype: torch.dtype) -> list:
    """PeerBuffers.local with what uninitialized symmetric memory may hold: NaN rows, garbage meta and counts."""
    from dlblas_compiler.library.peer_exchange import PeerBuffers, PeerExchange

    buffers = PeerBuffers.local(PeerExchange.shapes(ws, TOP_K, max_tokens, H, dtype), ws)
    g = torch.Generator().manual_seed(99)
    for b in buffers:
        for t in b.own.values():
            if t.is_floating_point():
                t.fill_(float("nan"))
            else:
                t.copy_(torch.randint(-(2**30), 2**30, t.shape, generator=g, dtype=t.dtype))
    return buffers


@pytest.mark.parametrize("ws", [2, 4])
def test_peer_exchange_matches_the_reference(ws: int) -> None:
    """The exchange through peer buffers (step by step, ranks in turn) on uneven, capacity-limited and starved
    routings, different token counts per rank (a rank with none), non-contiguous tokens, and calls one after
    another on buffers that start as garbage (NaN rows, random meta: stale rows must not count); float64 torch
    path."""
    owner = torch.arange(E) // (E // ws)
    buffers = _poisoned_buffers(ws, 40, torch.float64)
    for name, bias, tokens, cf in (
        ("uneven", 1.5 * (owner == 0).double(), [40, 17, 33, 1][:ws], None),
        ("capacity", torch.zeros(E, dtype=torch.float64), [40] * ws, 0.5),
        ("starved last rank", -20.0 * (owner == ws - 1).double(), [40, 8, 40, 25][:ws], None),
        ("a rank without tokens", torch.zeros(E, dtype=torch.float64), [0, 30, 7, 40][:ws], None),
    ):
        router, w_gate_up, w_down = _weights(seed=11)
        router[:, 0] = bias
        shards = [_tokens(500 + r, t) for r, t in enumerate(tokens)]
        if name == "capacity":  # every other column of a wider tensor
            shards = [torch.stack([x, -x], 2).reshape(x.shape[0], -1)[:, ::2] for x in shards]
            assert shards[0].stride(1) == 2
        outs = _simulate_peer_exchange(ws, shards, (router, w_gate_up, w_down), 40, False, cf, buffers)
        for r, (x, out) in enumerate(zip(shards, outs, strict=True)):
            ref = moe_reference(x, router, w_gate_up, w_down, TOP_K, cf)
            torch.testing.assert_close(out, ref, **F64_TOL, msg=lambda m, r=r, name=name: f"{name}, rank {r}: {m}")


@pytest.mark.parametrize("impl", ["triton", "grouped"])
def test_peer_exchange_triton_kernels(impl: str) -> None:
    """The same through the Triton kernels (address-table stores, combine) on the interpreter, float32, 2 ranks,
    two calls on garbage-filled buffers, one with non-contiguous tokens; the experts by either of fused_moe's
    paths over the receive buffer (rows past the received ones: no expert)."""
    weights = tuple(w.float() for w in _weights(seed=12))
    buffers = _poisoned_buffers(2, 12, torch.float32)
    for call, tokens in enumerate(([12, 5], [3, 12])):
        shards = [_tokens(600 + 10 * call + r, t, torch.float32) for r, t in enumerate(tokens)]
        if call == 1:
            shards = [torch.stack([x, -x], 2).reshape(x.shape[0], -1)[:, ::2] for x in shards]
        outs = _simulate_peer_exchange(2, shards, weights, 12, True, buffers=buffers, impl=impl)
        for x, out in zip(shards, outs, strict=True):
            ref = moe_reference(x.double(), *(w.double() for w in weights), TOP_K)
            torch.testing.assert_close(out.double(), ref, **F32_TOL)


def test_run_peer_exchange_with_ranks_as_threads() -> None:
    """EPMoE's own driver of the four steps (`run_peer_exchange`), each rank a thread whose barrier waits for the
    others, on the torch path (float64): what the GPUs run, in order, with real waits."""
    import dataclasses
    import threading

    from dlblas_compiler.library.ep_moe import run_peer_exchange
    from dlblas_compiler.library.moe_gemm import fused_moe_reference
    from dlblas_compiler.library.peer_exchange import PeerExchange

    ws, tokens = 4, [16, 0, 9, 16]
    router, w_gate_up, w_down = _weights(seed=13)
    wait = threading.Barrier(ws).wait
    buffers = [dataclasses.replace(b, barrier=lambda: wait(timeout=60)) for b in _poisoned_buffers(ws, 16,
                                                                                                  torch.float64)]
    shards = [_tokens(700 + r, t) for r, t in enumerate(tokens)]
    outs: list = [None] * ws
    part = E // ws

    def rank(r: int) -> None:
        route = topk_gating_reference(router_logits(shards[r], router), TOP_K)
        mine = slice(r * part, (r + 1) * part)
        experts = lambda rows, ids, w: fused_moe_reference(rows, w_gate_up[mine], w_down[mine], ids, w)  # noqa: E731
        ex = PeerExchange(buffers[r], E, TOP_K, 16)
        outs[r] = run_peer_exchange(ex, shards[r], route.ids, route.weights, experts, False)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ws)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r, x in enumerate(shards):
        torch.testing.assert_close(outs[r], moe_reference(x, router, w_gate_up, w_down, TOP_K), **F64_TOL)


@pytest.mark.parametrize("tokens", [[16, 0, 9, 16], [1, 15, 2, 7]])
def test_overlapped_peer_exchange_with_ranks_as_threads(tokens: list[int]) -> None:
    """The overlapped driver (`run_peer_exchange_overlapped`): two halves, each through its own garbage-filled
    buffers with half the room and its own barrier (a thread barrier per set), ranks as threads, three calls in
    a row with new tokens (the halves' buffers reused), ranks with no tokens, one token (an empty second half)
    and odd counts; float64 torch path against the reference."""
    import dataclasses
    import threading

    from dlblas_compiler.library.ep_moe import run_peer_exchange_overlapped
    from dlblas_compiler.library.moe_gemm import fused_moe_reference
    from dlblas_compiler.library.peer_exchange import PeerExchange

    ws, room = 4, 8
    router, w_gate_up, w_down = _weights(seed=14)
    sets = []
    for _ in range(2):
        wait = threading.Barrier(ws).wait
        sets.append([dataclasses.replace(b, barrier=lambda wait=wait: wait(timeout=60))
                     for b in _poisoned_buffers(ws, room, torch.float64)])  # fmt: skip
    part = E // ws
    outs: dict = {}
    failures: list = []

    def rank(r: int) -> None:
        try:
            mine = slice(r * part, (r + 1) * part)
            experts = lambda rows, ids, w: fused_moe_reference(rows, w_gate_up[mine], w_down[mine], ids, w)  # noqa: E731
            halves = tuple(PeerExchange(sets[h][r], E, TOP_K, room) for h in range(2))
            for call in range(3):
                x = _tokens(800 + 10 * call + r, tokens[(r + call) % ws])
                route = topk_gating_reference(router_logits(x, router), TOP_K)
                outs[r, call] = x, run_peer_exchange_overlapped(halves, x, route.ids, route.weights, experts, False)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)
            raise

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ws)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    assert len(outs) == 3 * ws
    for (r, call), (x, out) in outs.items():
        torch.testing.assert_close(out, moe_reference(x, router, w_gate_up, w_down, TOP_K), **F64_TOL,
                                   msg=lambda m, r=r, call=call: f"rank {r}, call {call}: {m}")


def test_peer_exchange_refuses_more_tokens_than_its_room() -> None:
    from dlblas_compiler.library.peer_exchange import PeerBuffers, PeerExchange

    buffers = PeerBuffers.local(PeerExchange.shapes(2, TOP_K, 4, H, torch.float64), 2)
    with pytest.raises(ValueError, match="5 tokens on rank 0 exceed peer_tokens=4"):
        PeerExchange(buffers[0], E, TOP_K, 4).send_counts(torch.zeros(5, TOP_K, dtype=torch.long), False)
    with pytest.raises(ValueError, match="needs CUDA"):
        EPMoE(*_weights(seed=8), TOP_K, peer_tokens=4)._peer_exchange(
            _tokens(1, 3), torch.zeros(3, TOP_K, dtype=torch.long), torch.ones(3, TOP_K), False, None)
    with pytest.raises(ValueError, match="give one"):
        EPMoE(*_weights(seed=8), TOP_K, peer_tokens=4, padded_tokens=4)
    with pytest.raises(ValueError, match="peer_tokens must be a positive int"):
        EPMoE(*_weights(seed=8), TOP_K, peer_tokens=True)
    with pytest.raises(ValueError, match="reference backend"):
        EPMoE(*_weights(seed=8), TOP_K, peer_tokens=4, cuda_graphs=True, backend="reference")


def _gpu_worker(rank: int, ws: int, init_file: str) -> None:
    """On GPU `rank`: the peer exchange and CUDA-graph replay against the float32 reference of the same bf16
    weights, with different token counts per rank and new tokens on every call."""
    import faulthandler
    from datetime import timedelta

    faulthandler.dump_traceback_later(150, exit=True)  # a rank stuck in an exchange: its stack, then a failure
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=ws,
                            timeout=timedelta(seconds=60), device_id=device)
    try:
        _gpu_cases(rank, ws, device)
        torch.cuda.synchronize()  # the layers, their buffers and graphs are gone before the group is
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: done, {time.perf_counter() - START:.0f} s", flush=True)


def _gpu_cases(rank: int, ws: int, device: torch.device) -> None:
    g = torch.Generator().manual_seed(20)
    hidden, inter, experts = 256, 384, 4 * ws
    router = torch.randn(experts, hidden, generator=g) / hidden**0.5
    w_gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w_down = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    weights = [w.to(device, torch.bfloat16) for w in (router, w_gate_up, w_down)]
    for kw in ({"peer_tokens": 96}, {"peer_tokens": 96, "cuda_graphs": True},
               {"peer_tokens": 96, "overlap": True}, {"peer_tokens": 96, "overlap": True, "cuda_graphs": True},
               {"padded_tokens": 96, "cuda_graphs": True}):
        layer = EPMoE(*weights, TOP_K, **kw)
        for call in range(4):  # eager, capture + replay, replays
            tokens = 96 if rank == 0 else 40 + 8 * rank
            x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(call * 10 + rank))
            x = x.to(device, torch.bfloat16)
            out = layer(x)
            print(f"rank {rank}: {kw}, call {call}, {time.perf_counter() - START:.0f} s", flush=True)
            ref = moe_reference(x.float(), *(w.float() for w in weights), TOP_K)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"{kw}, call {call}, rank {rank}: rel err {err:.2e}"


@pytest.mark.gpu
def test_peer_exchange_and_graphs_on_gpus(tmp_path) -> None:
    """EPMoE's exchange through symmetric memory (and the CUDA-graph replays) on every GPU of this machine."""
    ws = torch.cuda.device_count()
    if ws < 2:
        pytest.skip(f"needs 2 or more GPUs, this machine has {ws}")
    mp.spawn(_gpu_worker, args=(ws, str(tmp_path / "init")), nprocs=ws)


def test_partial_sums_go_back_taking_the_senders_in_turn() -> None:
    """The return's put programs take the received rows round the senders (sender i % ws's row i // ws), so that
    programs side by side store over different links; every received row exactly once, none past a sender's count."""
    from dlblas_compiler.library.peer_exchange import PeerBuffers, PeerExchange

    ws, max_tokens = 3, 5
    b = PeerBuffers.local(PeerExchange.shapes(ws, 2, max_tokens, 4, torch.float32), ws)[1]
    b.own["counts"][:, 1] = torch.tensor([2, 0, 4], dtype=torch.int32)  # rows from senders 0, 1, 2 at rank 1
    order = PeerExchange(b, 6, 2, max_tokens)._senders_in_turn(ws * max_tokens)
    assert order.tolist() == [0, -1, 2, 1, -1, 3, -1, -1, 4, -1, -1, 5, -1, -1, -1]


def _timeout_worker(rank: int, init_file: str, marker: str) -> None:
    """Two ranks call the peer exchange once together; then rank 1 skips a call and rank 0's barrier must give
    up after barrier_timeout_s (2 s) with a CUDA error, not spin. Rank 0 writes what it saw to `marker`."""
    import faulthandler
    from datetime import timedelta

    faulthandler.dump_traceback_later(120, exit=True)  # (a barrier that never gives up: a failure, not a hang)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60), device_id=device)
    g = torch.Generator().manual_seed(3)
    shapes = ((8, 64), (8, 192, 64), (8, 64, 96))  # router, gate/up, down: 8 experts, H = 64, I = 96
    weights = [torch.randn(*shape, generator=g).to(device, torch.bfloat16) for shape in shapes]
    layer = EPMoE(*weights, 2, peer_tokens=16, barrier_timeout_s=2.0)
    x = torch.randn(16, 64, generator=g).to(device, torch.bfloat16)
    layer(x)
    torch.cuda.synchronize()
    if rank == 1:  # alive, its buffers mapped, but not calling: wait for rank 0's verdict
        deadline = time.time() + 90
        while not os.path.exists(marker) and time.time() < deadline:
            time.sleep(0.2)
        os._exit(0)
    t0 = time.time()
    try:
        layer(x)
        torch.cuda.synchronize()
        verdict = "returned"
    except Exception as e:  # noqa: BLE001 - the expected outcome: the barrier stopped the GPU
        verdict = f"error after {time.time() - t0:.1f} s: {type(e).__name__}: {e}"
    with open(marker, "w") as f:
        f.write(verdict)
    os._exit(0)  # (the CUDA context is gone: no orderly teardown)


@pytest.mark.gpu
def test_peer_exchange_barrier_times_out_when_a_rank_skips_a_call(tmp_path) -> None:
    """A rank that does not come to the exchange's barrier makes the waiting rank fail after barrier_timeout_s
    (torch's symmetric-memory barrier traps), where it used to spin forever."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    marker = tmp_path / "verdict"
    mp.start_processes(_timeout_worker, args=(str(tmp_path / "init"), str(marker)), nprocs=2, join=True,
                       start_method="spawn")
    verdict = marker.read_text()
    assert verdict.startswith("error after"), verdict
    assert float(verdict.split()[2]) < 60, verdict
