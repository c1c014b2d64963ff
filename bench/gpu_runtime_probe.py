"""GPU runtime probe: CUDA graphs (outputs kept across replays, side streams, specializations), misaligned input
pointers, grids past 65535 rows or heads, attention head dims and cross lengths, in-place writes under graphs, fp16
scalars past fp16's range. Each case against eager on the same GPU; prints PASS / FAIL / ERROR per case and a summary.
Run on the device: `bash bench/device.sh python3 bench/gpu_runtime_probe.py [CASE ...]` (results:
bench/results/*runtime-probe*)."""
import math
import sys
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_

dev = "cuda"
results = []


def case(fn):
    name = fn.__name__
    if len(sys.argv) > 1 and name not in sys.argv[1:]:  # (cases named on the command line: only those)
        return fn
    try:
        msg = fn()
        results.append((name, "PASS", msg or ""))
    except AssertionError as e:
        results.append((name, "FAIL", str(e)[:400]))
    except Exception as e:
        results.append((name, "ERROR", f"{type(e).__name__}: {str(e)[:400]}"))
        traceback.print_exc()
    print(results[-1], flush=True)
    return fn


def close(a, b, tol, what=""):
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item() if a.numel() else 0.0
    scale = b.abs().max().item() if b.numel() else 1.0
    assert a.shape == b.shape, f"{what} shape {a.shape} vs {b.shape}"
    assert math.isfinite(err) and err <= tol * max(1.0, scale), f"{what} err {err} scale {scale}"
    return err


def block(dtype=torch.bfloat16, cfg=None):
    cfg = cfg or BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)
    m = randomize_(LlamaBlock(cfg)).eval().to(dev, dtype)
    return cfg, m


@case
def graphs_outputs_kept_across_calls():
    cfg, m = block()
    cm = dc.compile(m, backend="triton", cuda_graphs=True, tune="none")
    x, cos, sin = llama_block_inputs(cfg, 2, 48, torch.bfloat16, dev)
    outs, refs = [], []
    with torch.no_grad():
        for _ in range(5):
            x.copy_(torch.randn_like(x))  # same address each call
            outs.append(cm(x, cos, sin))
            refs.append(m(x, cos, sin))
    torch.cuda.synchronize()
    return [round(close(o, r, 3e-2, f"call {i}"), 4) for i, (o, r) in enumerate(zip(outs, refs, strict=True))]


@case
def graphs_side_stream():
    cfg, m = block()
    cm = dc.compile(m, backend="triton", cuda_graphs=True, tune="none")
    s = torch.cuda.Stream()
    errs = []
    with torch.no_grad():
        for i in range(4):
            with torch.cuda.stream(s):
                x, cos, sin = llama_block_inputs(cfg, 1, 40, torch.bfloat16, dev, seed=i)
                x = x * 1.0 + i  # produced on the side stream just before the call
                y = cm(x, cos, sin)
                r = m(x, cos, sin)
            s.synchronize()
            errs.append(close(y, r, 3e-2, f"call {i}"))
    return errs


@case
def misaligned_input_pointer():
    cfg, m = block()
    cm = dc.compile(m, backend="triton", tune="none")
    errs = []
    with torch.no_grad():
        for off in (0, 1, 3, 8):
            x, cos, sin = llama_block_inputs(cfg, 1, 33, torch.bfloat16, dev)
            big = torch.empty(x.numel() + 16, dtype=x.dtype, device=dev)
            xm = big[off:off + x.numel()].view(x.shape)
            xm.copy_(x)
            errs.append(close(cm(xm, cos, sin), m(xm, cos, sin), 3e-2, f"offset {off}"))
    return errs


@case
def misaligned_linear_input():
    lin = nn.Sequential(nn.Linear(200, 300), nn.GELU(), nn.Linear(300, 130)).to(dev, torch.float16).eval()
    cm = dc.compile(lin, backend="triton", tune="none")
    errs = []
    with torch.no_grad():
        for off in (0, 1, 5):
            big = torch.randn(70 * 200 + 8, device=dev, dtype=torch.float16)
            x = big[off:off + 70 * 200].view(70, 200)
            errs.append(close(cm(x), lin(x), 1e-2, f"off {off}"))
    return errs


@case
def many_rows_grid_limits():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (self.w * h).to(x.dtype).softmax(-1) + torch.sigmoid(x)

    m = M().to(dev)
    cm = dc.compile(m, backend="triton", tune="none")
    with torch.no_grad():
        x = torch.randn(70001, 64, device=dev)
        y = cm(x)
        x2 = torch.randn(3, 70001, 64, device=dev)
        y2 = cm(x2)
    return [close(y, m(x), 1e-4), close(y2, m(x2), 1e-4)]


@case
def attention_many_heads_grid():
    class A(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    cm = dc.compile(A(), backend="triton", tune="none")
    with torch.no_grad():
        q = torch.randn(700, 100, 4, 32, device=dev, dtype=torch.bfloat16)  # B*H = 70000
        k, v = torch.randn_like(q), torch.randn_like(q)
        return close(cm(q, k, v), A()(q, k, v), 3e-2)


@case
def attention_head_dims():
    class A(nn.Module):
        def __init__(self, causal):
            super().__init__()
            self.causal = causal

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    errs = {}
    for d in (40, 80, 96, 112, 160, 256):
        for causal in (True, False):
            m = A(causal)
            cm = dc.compile(m, backend="triton", tune="none")
            with torch.no_grad():
                for sq in (1, 77, 300):
                    q = torch.randn(2, 3, sq, d, device=dev, dtype=torch.bfloat16)
                    k = torch.randn(2, 3, sq, d, device=dev, dtype=torch.bfloat16)
                    v = torch.randn_like(k)
                    errs[(d, causal, sq)] = round(close(cm(q, k, v), m(q, k, v), 3e-2, f"d{d} c{causal} s{sq}"), 4)
    return max(errs.values())


@case
def attention_cross_lengths_and_gqa():
    class A(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=0.3)

    m = A()
    cm = dc.compile(m, backend="triton", tune="none")
    errs = []
    with torch.no_grad():
        for sq, sk in ((1, 513), (7, 3), (129, 1000)):
            q = torch.randn(2, 8, sq, 64, device=dev, dtype=torch.float16)
            k = torch.randn(2, 2, sk, 64, device=dev, dtype=torch.float16)
            v = torch.randn_like(k)
            errs.append(close(cm(q, k, v), m(q, k, v), 1e-2, f"{sq}x{sk}"))
    return errs


@case
def inplace_input_writes_under_graphs():
    class W(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)
            self.register_buffer("count", torch.zeros((), dtype=torch.long))

        def forward(self, x, acc):
            acc.add_(self.lin(x).relu())
            self.count += 1
            return acc * 2

    m = W().to(dev)
    ref = W().to(dev)
    ref.load_state_dict(m.state_dict())
    cm = dc.compile(m, backend="triton", cuda_graphs=True, tune="none")
    x = torch.randn(16, 64, device=dev)
    acc, acc_r = torch.zeros(16, 64, device=dev), torch.zeros(16, 64, device=dev)
    with torch.no_grad():
        for _ in range(5):
            y = cm(x, acc)
            yr = ref(x, acc_r)
    close(acc, acc_r, 1e-4, "acc")
    assert m.count.item() == ref.count.item() == 5, (m.count.item(), ref.count.item())
    return close(y, yr, 1e-4)


@case
def fp32_and_fp16_blocks_dynamic_lengths():
    errs = []
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 1e-2)):
        cfg, m = block(dtype)
        cm = dc.compile(m, backend="triton", cuda_graphs=True, tune="none")
        with torch.no_grad():
            for seq in (5, 9, 17, 33, 64, 1, 130):
                x, cos, sin = llama_block_inputs(cfg, 2, seq, dtype, dev, seed=seq)
                errs.append(close(cm(x, cos, sin), m(x, cos, sin), tol, f"{dtype} {seq}"))
    return max(errs)


@case
def output_kept_across_specializations():
    cfg, m = block()
    cm = dc.compile(m, backend="triton", cuda_graphs=True, tune="none")
    with torch.no_grad():
        x, cos, sin = llama_block_inputs(cfg, 1, 16, torch.bfloat16, dev)
        y1 = cm(x, cos, sin)
        y1b = cm(x, cos, sin)
        y1c = cm(x, cos, sin)
        r1 = m(x, cos, sin)
        x2, cos2, sin2 = llama_block_inputs(cfg, 3, 16, torch.bfloat16, dev, seed=3)
        for _ in range(3):
            cm(x2, cos2, sin2)
    torch.cuda.synchronize()
    return [close(y, r1, 3e-2) for y in (y1, y1b, y1c)]


@case
def torch_compile_backend_reduce_overhead():
    cfg, m = block()
    from torch._dynamo.backends.registry import list_backends, register_backend

    from dlblas_compiler.dynamo import dlblas_backend

    if "dlblas" not in list_backends(exclude_tags=()):  # (bench/device.sh: the package on PYTHONPATH, no entry point)
        register_backend(name="dlblas")(dlblas_backend)
    fast = torch.compile(m, backend="dlblas", mode="reduce-overhead")
    errs = []
    with torch.no_grad():
        for seq in (8, 8, 8, 12):
            x, cos, sin = llama_block_inputs(cfg, 1, seq, torch.bfloat16, dev, seed=seq)
            errs.append(close(fast(x, cos, sin), m(x, cos, sin), 3e-2))
    return errs


@case
def noncontiguous_weight_and_input_views():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(96, 128) * 0.1)

        def forward(self, x):
            return F.silu(x @ self.w.t()[:, 1::2].t().t()) * 2  # a strided view of the weight

    m = M().to(dev)
    cm = dc.compile(m, backend="triton", tune="none")
    with torch.no_grad():
        x = torch.randn(40, 256, device=dev)[:, ::2]
        return close(cm(x), m(x), 1e-4)


@case
def fp16_scalar_beyond_range_cuda_eager():
    class M(nn.Module):
        def forward(self, y):
            return y + 1e5, (y + 1e5) - 1e5, y * 1e5

    y = torch.tensor([-60000.0, 1.0, 60000.0], device=dev, dtype=torch.float16)
    m = M()
    cm = dc.compile(m, backend="triton", tune="none")
    with torch.no_grad():
        e, c = m(y), cm(y)
        cpu = m(y.cpu())
    return {"cuda eager": [t.tolist() for t in e], "ours": [t.tolist() for t in c],
            "cpu eager": [t.tolist() for t in cpu]}


@case
def half_after_graph_replays():
    class Ids(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 256)
            self.lin = nn.Linear(256, 256)

        def forward(self, ids):
            return F.silu(self.lin(self.emb(ids)))

    m = Ids().to(dev).eval()
    cm = dc.compile(m, backend="triton", cuda_graphs=True, tune="none")
    ids = torch.randint(0, 100, (4, 32), device=dev)
    with torch.no_grad(), __import__("warnings").catch_warnings(record=True) as caught:
        __import__("warnings").simplefilter("always")
        for _ in range(4):
            cm(ids)
        m.half()
        y = cm(ids)
        y2 = cm(ids)
    assert y.dtype == torch.float16, y.dtype
    assert not [w for w in caught if "capture failed" in str(w.message)], [str(w.message) for w in caught]
    return [close(y, m(ids), 1e-2), close(y2, m(ids), 1e-2), cm.compile_count]


torch.manual_seed(0)
print("\nSUMMARY")
for r in results:
    print(*r, sep=" | ")
sys.exit(0)
