"""Expert-parallel MoE (EPMoE) on 1, 2 and 4 GPUs: correctness, then throughput and the time split.

    python bench/ep_moe.py --out OUT [--worlds 1,2,4] [--iters 20]   # NCCL, one process per GPU, bf16
    python bench/ep_moe.py --out OUT --smoke                          # CPU, gloo, tiny layers, worlds 1 and 2

Writes OUT/ep_moe.json and OUT/ep_moe.md and prints the markdown table. Layers: Mixtral-like (E=8, H=4096,
I=14336, top-2) and DeepSeek-like (E=64, H=2048, I=1408, top-6), 4096 tokens per rank, no capacity limit. Each
world size (those above the GPU count are skipped) runs in its own torch.multiprocessing.spawn; the NCCL
environment is left as it is. Per layer and world size:
  correctness  each rank's output vs moe_reference in float32 on the same weights and its own tokens;
               rel err = ||out - ref|| / ||ref|| over all ranks' tokens, must be <= 1e-2;
  timing       after warmup, the median over iterations of the slowest rank's wall time (barrier,
               synchronize, forward, synchronize); tokens/s counts all ranks' tokens. route / dispatch /
               compute / combine: EPMoE's CUDA-event split (medians, slowest rank); with overlap the
               dispatch and combine columns hold only the communication not hidden behind compute.
Probes, per world size: all_to_all_single and the peer stores (`put_rows`) moving the same volume, and the peer
exchange alone in DeepSeek-V3's units (H=7168, top-8 of 256 experts), replayed from graphs, dispatch and combine
apart. `--variants` chooses the rows (default ep, ep+overlap, ep+padded, ep+peer); `--trace V1,V2` adds a
torch.profiler summary of those variants' calls. dispatch / combine GB/s: NCCL variants only (the peer exchange
moves one row per (token, rank), and its phases are split differently: "compute" includes returning the partial
sums, "combine" is the local sum).
Variants: 1 GPU: "torch loop" (moe_reference in bf16: router + loop over experts), "fused_moe" (EPMoE on one
rank: topk_gating + fused_moe) and, if asked for, "fused_moe+graph" (the same replayed from a CUDA graph);
several GPUs: "ep" (EPMoE, overlap off), "ep+overlap" (two chunks) and
"ep+padded" (padded_tokens = the tokens per rank: fixed blocks, no wait for the host), "ep+peer" (peer_tokens: rows
written into the other GPUs' memory, counts exchanged there, no NCCL, no wait for the host), "ep+peer+overlap" (the
same in two halves, a second stream moving one half while the other's experts run); "+graph": the same
replayed from a CUDA graph (cuda_graphs=True; no phase split: the timings need events between the phases).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYERS = {
    "mixtral": {"E": 8, "H": 4096, "I": 14336, "k": 2},
    "deepseek": {"E": 64, "H": 2048, "I": 1408, "k": 6},
}
SMOKE_LAYERS = {
    "mixtral": {"E": 8, "H": 64, "I": 96, "k": 2},
    "deepseek": {"E": 16, "H": 32, "I": 24, "k": 4},
}
MAX_REL_ERR = 1e-2
PHASES = ("route", "plan", "dispatch", "compute", "combine")
MODULE = "dlblas_compiler.library.ep_moe"


def _weights(shape: dict[str, int], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(router, w_gate_up, w_down), the same on every rank (seeded generator), ~unit-variance activations."""
    E, H, inter = shape["E"], shape["H"], shape["I"]
    g = torch.Generator(device).manual_seed(0)

    def randn(*size: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(*size, generator=g, device=device, dtype=dtype) / fan_in**0.5).to(dtype)

    return randn(E, H, fan_in=H), randn(E, 2 * inter, H, fan_in=H), randn(E, H, inter, fan_in=inter)


def _time(fn: Callable[[dict[str, float]], Any], iters: int, warmup: int, cuda: bool) -> dict[str, Any]:
    """Per iteration: barrier, synchronize, fn(timings), synchronize; the slowest rank's wall time (ms) and
    phase times. Returns the medians."""

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    walls, phases = [], []
    for i in range(warmup + iters):
        timings: dict[str, float] = {}
        dist.barrier()
        sync()
        start = time.perf_counter()
        fn(timings)
        sync()
        if i >= warmup:
            walls.append((time.perf_counter() - start) * 1e3)
            phases.append([timings.get(p, float("nan")) for p in PHASES])
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    per_iter = torch.tensor([[w, *p] for w, p in zip(walls, phases, strict=True)], dtype=torch.float64, device=device)
    dist.all_reduce(per_iter, op=dist.ReduceOp.MAX)  # the slowest rank
    medians = per_iter.median(dim=0).values.tolist()
    return {"ms": medians[0], **{f"{p}_ms": v for p, v in zip(PHASES, medians[1:], strict=True) if v == v}}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over all ranks' tokens."""
    sums = torch.stack([(out.double() - ref.double()).square().sum(), ref.double().square().sum()])
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).sqrt().item()


def _layer_rows(name: str, shape: dict[str, int], args: argparse.Namespace, device: torch.device) -> list[dict]:
    import importlib

    from dlblas_compiler.library import moe_reference

    EPMoE = importlib.import_module(args.module).EPMoE  # noqa: N806 - a class

    ws, rank = dist.get_world_size(), dist.get_rank()
    cuda = device.type == "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    weights = _weights(shape, dtype, device)
    g = torch.Generator(device).manual_seed(1000 + rank)
    x = torch.randn(args.tokens, shape["H"], generator=g, device=device, dtype=dtype)
    ref = moe_reference(x.float(), *(w.float() for w in weights), shape["k"])

    variants: dict[str, Callable[[dict[str, float]], torch.Tensor]] = {}
    if ws == 1:
        variants["torch loop"] = lambda _t: moe_reference(x, *weights, shape["k"])
        layer = EPMoE(*weights, shape["k"])
        variants["fused_moe"] = lambda t: layer(x, timings=t)
        if cuda and "fused_moe+graph" in args.variants:
            graphed = EPMoE(*weights, shape["k"], cuda_graphs=True)
            variants["fused_moe+graph"] = lambda _t: graphed(x)
    else:
        for label, kw in (
            ("ep", {}),
            ("ep+overlap", {"overlap": True}),
            ("ep+padded", {"padded_tokens": args.tokens}),
            ("ep+padded+graph", {"padded_tokens": args.tokens, "cuda_graphs": True}),
            ("ep+peer", {"peer_tokens": args.tokens}),
            ("ep+peer+graph", {"peer_tokens": args.tokens, "cuda_graphs": True}),
            ("ep+peer+overlap", {"peer_tokens": args.tokens, "overlap": True}),
            ("ep+peer+overlap+graph", {"peer_tokens": args.tokens, "overlap": True, "cuda_graphs": True}),
        ):
            if label in args.variants and ("peer" not in label and "graph" not in label or cuda):
                layer = EPMoE(*weights, shape["k"], **kw)
                variants[label] = lambda t, layer=layer: layer(x, timings=t if not layer.cuda_graphs else None)

    rows = []
    for label, fn in variants.items():
        row: dict[str, Any] = {"layer": name, **shape, "world": ws, "variant": label, "tokens_per_rank": args.tokens}
        if args.module != MODULE:
            row["module"] = args.module
        row["rel_err"] = _rel_err(fn({}), ref)
        row["ok"] = row["rel_err"] <= MAX_REL_ERR
        row.update(_time(fn, args.iters, args.warmup, cuda))
        row["tokens_per_s"] = ws * args.tokens / row["ms"] * 1e3
        if ws > 1 and row.get("dispatch_ms") and "peer" not in label:  # (the peer exchange sends other volumes)
            leaving = args.tokens * shape["k"] * shape["H"] * x.element_size() * (ws - 1) / ws
            row["dispatch_GB_per_s"] = leaving / row["dispatch_ms"] / 1e6
            row["combine_GB_per_s"] = leaving / row["combine_ms"] / 1e6
        if ws > 1 and label in args.trace:
            row["trace"] = _trace(fn, cuda)
        rows.append(row)
    return rows


def _trace(fn: Callable[[dict[str, float]], Any], cuda: bool) -> dict[str, Any]:
    """torch.profiler over 3 calls (every rank runs them; rank 0's summary is kept): the host ops and the GPU
    kernels with the most time, and the host's waits for the GPU (synchronize and device-to-host copies)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    dist.barrier()
    with profile(activities=activities) as prof:
        for _ in range(3):
            fn({})
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()

    def top(key: Callable[[Any], float], n: int, keep: Callable[[Any], bool]) -> list[list]:
        chosen = sorted((e for e in events if keep(e)), key=key, reverse=True)[:n]
        return [[e.key[:90], e.count, round(key(e) / 1e3 / 3, 3)] for e in chosen]  # ms per call

    def device_us(e: Any) -> float:
        return getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0)

    waits = [e for e in events if "Synchronize" in e.key or "MemcpyDtoH" in e.key or "cudaMemcpy" in e.key]
    return {
        "host_ops_ms_per_call": top(lambda e: e.self_cpu_time_total, 15, lambda e: True),
        "gpu_kernels_ms_per_call": top(device_us, 12, lambda e: device_us(e) > 0),
        "host_waits": [[e.key, e.count, round(e.self_cpu_time_total / 1e3 / 3, 3)] for e in waits],
    }


def _all_to_all_probe(ws: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """What the interconnect gives all_to_all_single: the Mixtral layer's dispatch volume (tokens x top-2 rows
    of H=4096 bf16 per rank, split evenly), median of 10 timed calls; and whether the GPUs have peer access."""
    dtype = torch.float32 if args.smoke else torch.bfloat16
    rows = args.tokens * 2 // ws * ws
    send = torch.randn(rows, 64 if args.smoke else 4096, device=device).to(dtype)
    recv = torch.empty_like(send)
    times = []
    for i in range(13):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        dist.all_to_all_single(recv, send)
        _sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    ms = sorted(times)[len(times) // 2] * 1e3
    nbytes = send.numel() * send.element_size() * (ws - 1) / ws  # what leaves this rank
    peer = device.type == "cuda" and torch.cuda.can_device_access_peer(0, 1)
    return {"world": ws, "probe": "all_to_all_single", "MB_per_rank": nbytes / 1e6, "ms": ms,
            "GB_per_s": nbytes / ms / 1e6, "peer_access": peer}  # fmt: skip


def _peer_probe(ws: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The all_to_all probe's volume (tokens x 2 rows of H=4096 bf16 a rank, split evenly) moved as the peer
    exchange moves rows: one `put_rows` kernel storing each rank's block of rows into every rank's symmetric
    buffer, then the stream barrier (median of 10 timed calls)."""
    from dlblas_compiler.library.peer_exchange import PeerBuffers

    rows, H = args.tokens * 2 // ws * ws, 4096
    block = rows // ws
    buffers = PeerBuffers.symmetric({"recv": ((rows, H), torch.bfloat16)}, None, device)
    src = torch.randn(rows, H, device=device).to(torch.bfloat16)
    index = torch.arange(rows, device=device)
    dest_rank, dest_pos = index // block, dist.get_rank() * block + index % block
    times = []
    for i in range(13):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        buffers.put_rows("recv", src, index, dest_rank, dest_pos, use_triton=True)
        buffers.barrier()
        _sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    mine = slice(dist.get_rank() * block, (dist.get_rank() + 1) * block)
    assert torch.equal(buffers.own["recv"][mine], src[mine])  # the block this rank sent itself
    ms = sorted(times)[len(times) // 2] * 1e3
    nbytes = rows * H * 2 * (ws - 1) / ws
    return {"world": ws, "probe": "put_rows (peer stores)", "MB_per_rank": nbytes / 1e6, "ms": ms,
            "GB_per_s": nbytes / ms / 1e6, "peer_access": True}


def _peer_latency_probe(ws: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The peer exchange alone, in DeepSeek-V3's units (H=7168, top-8 of 256 experts, bf16, args.tokens tokens a
    rank, random routing), replayed from two CUDA graphs: dispatch (counts, barrier, token and meta rows, barrier)
    and combine (the owners return each row as its own partial sum, barrier, the senders add them): no expert
    GEMMs. Medians of 20 replays of each, CUDA events between the replays on one stream."""
    from dlblas_compiler.library.ep_moe import combine
    from dlblas_compiler.library.peer_exchange import PeerBuffers, PeerExchange

    H, E, k, T = 7168, 256, 8, args.tokens
    buffers = PeerBuffers.symmetric(PeerExchange.shapes(ws, k, T, H, torch.bfloat16), None, device)
    ex = PeerExchange(buffers, E, k, T)
    g = torch.Generator(device).manual_seed(dist.get_rank())
    x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
    ids = torch.rand(T, E, device=device, generator=g).topk(k, dim=1).indices
    weights = torch.full((T, k), 1.0 / k, device=device)
    pos: list[torch.Tensor] = []

    def dispatch() -> None:
        sends = ex.send_counts(ids, True)
        buffers.barrier()
        pos[:] = [ex.send_rows(x, weights, sends, True)]
        buffers.barrier()

    def back() -> torch.Tensor:
        ex.compute_and_return(lambda rows, _ids, _w: rows, True)
        buffers.barrier()
        return combine(buffers.own["back"], pos[0], torch.ones(pos[0].shape, device=device), True)

    dispatch(), back()  # compile the kernels
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    with torch.cuda.graph(graphs[0]):
        dispatch()
    with torch.cuda.graph(graphs[1]):
        out = back()
    times = []
    for i in range(25):
        dist.barrier()
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        graphs[0].replay()
        events[1].record()
        graphs[1].replay()
        events[2].record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append([events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2])])
    ranks_hit = (ids // (E // ws))[:, :, None].eq(torch.arange(ws, device=device)).any(1).sum(1)  # [T]
    # each rank holding a token's experts returned the token row itself: the sum is the row times that count
    torch.testing.assert_close(out.float(), x.float() * ranks_hit[:, None], rtol=2e-2, atol=2e-2)
    med = torch.tensor(times).median(0).values.tolist()
    return {"world": ws, "probe": "peer exchange alone (graphs)", "tokens": T, "H": H, "top_k": k, "experts": E,
            "rows_per_token": ranks_hit.float().mean().item(), "dispatch_us": med[0] * 1e3,
            "combine_us": med[1] * 1e3}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _worker(rank: int, ws: int, args: argparse.Namespace, init_file: str, result_file: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.smoke:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=ws)
    else:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=ws,
            timeout=timedelta(seconds=120),
            device_id=device,
        )
    try:
        rows = [] if ws == 1 else [_all_to_all_probe(ws, args, device)]
        if ws > 1 and device.type == "cuda":
            rows += [_peer_probe(ws, args, device), _peer_latency_probe(ws, args, device)]
        for name, shape in (SMOKE_LAYERS if args.smoke else LAYERS).items():
            rows += _layer_rows(name, shape, args, device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if rank == 0:
            Path(result_file).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def _run_world(ws: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Spawn ws ranks; their rows, or one error row. Ranks still running after args.world_timeout are ended."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file, result_file = f"{tmp}/init", f"{tmp}/rows.json"
        start = time.perf_counter()
        ctx = mp.spawn(_worker, args=(ws, args, init_file, result_file), nprocs=ws, join=False)
        try:
            while not ctx.join(timeout=5):
                if time.perf_counter() - start > args.world_timeout:
                    for p in ctx.processes:
                        p.terminate()
                        p.join()
                    return [{"world": ws, "error": f"timed out after {args.world_timeout} s"}]
        except Exception as e:  # a rank raised: ProcessRaisedException carries its traceback
            traceback.print_exc()
            return [{"world": ws, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1]}"}]
        rows = json.loads(Path(result_file).read_text())
        print(f"world {ws}: {time.perf_counter() - start:.0f} s", flush=True)
        return rows


def _markdown(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["layer", "GPUs", "variant", "rel err", "tokens/s", "ms", *(f"{p} ms" for p in PHASES)]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    probes = [r for r in rows if "probe" in r]
    rows = [r for r in rows if "probe" not in r]
    for r in rows:
        if "error" in r:
            lines.append(f"| | {r['world']} | error: {r['error'][:200]} |" + " |" * (len(columns) - 3))
            continue
        err = f"{r['rel_err']:.1e}" + ("" if r["ok"] else " FAIL")
        phases = [f"{r[f'{p}_ms']:.2f}" if f"{p}_ms" in r else "" for p in PHASES]
        cells = [r["layer"], str(r["world"]), r["variant"], err, f"{r['tokens_per_s']:,.0f}", f"{r['ms']:.2f}", *phases]
        lines.append("| " + " | ".join(cells) + " |")
    for p in probes:
        if "dispatch_us" in p:
            lines.append(f"\n{p['probe']} on {p['world']} ranks, {p['tokens']} tokens a rank (H={p['H']}, top-"
                         f"{p['top_k']} of {p['experts']} experts, {p['rows_per_token']:.2f} rows a token): dispatch "
                         f"{p['dispatch_us']:.0f} us, combine {p['combine_us']:.0f} us")
            continue
        lines.append(f"\n{p['probe']} on {p['world']} ranks: {p['MB_per_rank']:.0f} MB leave each rank in "
                     f"{p['ms']:.2f} ms = {p['GB_per_s']:.1f} GB/s per rank (peer access: {p['peer_access']})")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--worlds", default="1,2,4", help="world sizes, comma-separated")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per rank (4096; smoke: 64)")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations (20; smoke: 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed iterations first (3; smoke: 1)")
    parser.add_argument("--world-timeout", type=float, default=240.0, help="seconds allowed per world size")
    parser.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny layers, worlds 1 and 2")
    parser.add_argument("--module", default=MODULE, help="the module EPMoE comes from (an A/B against another version)")
    parser.add_argument("--variants", default="ep,ep+overlap,ep+padded,ep+peer",
                        help="variants, comma-separated (also ep+padded+graph, ep+peer+graph; fused_moe+graph on 1 GPU)")
    parser.add_argument("--trace", default="", help="variants to add a torch.profiler summary of 3 calls for")
    args = parser.parse_args()
    args.variants, args.trace = args.variants.split(","), args.trace.split(",")
    args.tokens = args.tokens or (64 if args.smoke else 4096)
    args.iters = args.iters or (3 if args.smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)

    worlds = [int(w) for w in args.worlds.split(",")]
    if args.smoke:
        worlds, device_name = [w for w in worlds if w <= 2], "CPU (smoke: gloo, float32, tiny layers)"
    elif not torch.cuda.is_available():
        sys.exit("bench/ep_moe.py needs CUDA GPUs (or --smoke)")
    else:
        skipped = [w for w in worlds if w > torch.cuda.device_count()]
        if skipped:
            print(f"skipping world sizes {skipped}: {torch.cuda.device_count()} GPUs", flush=True)
        worlds, device_name = [w for w in worlds if w not in skipped], torch.cuda.get_device_name()

    rows = [row for ws in worlds for row in _run_world(ws, args)]
    env = {
        "device": device_name,
        "torch": torch.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "tokens_per_rank": args.tokens,
        "iters": args.iters,
        "dtype": "float32" if args.smoke else "bfloat16",
    }
    if not args.smoke:  # the card's ceilings, measured in the same run (bench/ceilings.py), and NCCL's version
        from ceilings import measure

        env["ceilings"] = measure()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ep_moe.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    header = f"# EPMoE on {env['device']} ({env['dtype']}, {args.tokens} tokens/rank, torch {env['torch']})"
    table = _markdown(rows, header)
    (out / "ep_moe.md").write_text(table)
    print(table)
    if any("error" in r or not r.get("ok", True) for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
