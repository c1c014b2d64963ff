"""CUDA graphs beside other libraries' graphs (GPU)."""

import subprocess
import sys
import textwrap

import pytest

# Two programs of ours captured one after the other (the second capture is handed the first's cuBLAS workspace
# unless each makes its own), the first destroyed, then what another library's capture does (Inductor's CUDA-graph
# trees: every cuBLAS workspace dropped, the cache emptied), then the second replayed: in one process, since a
# fault ends its CUDA context.
SCRIPT = textwrap.dedent("""
    import gc, torch
    from dlblas_compiler.runtime import graphs
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    mm = lambda ins: (ins[0] @ ins[1],)
    first, second = graphs.CudaGraph(mm), graphs.CudaGraph(mm)
    assert first.capture([a, b]) and second.capture([a, b])
    del first
    gc.collect()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    for _ in range(3):
        out = second.replay([a, b])[0]
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    print("relative error", ((out.double() - ref).norm() / ref.norm()).item())
""")


@pytest.mark.gpu
def test_a_graph_replays_after_other_captures_drop_the_cublas_workspaces():
    """A captured program's cuBLAS calls use a workspace of its own graph's pool (runtime.graphs.captured): after
    another capture drops PyTorch's workspaces and empties the cache, the replay is right. The fault this guards
    against (an illegal memory access on an H200 with a Phi-3 model of ours beside one under reduce-overhead,
    bench/NOTES.md 104) was not reproduced by this scenario on the tree before the fix: the model runs are the
    evidence for the fix; this keeps the scenario's replay checked."""
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    err = float(r.stdout.split("relative error")[-1])
    assert err < 1e-2  # (bf16 operands and result: ~3e-3 against float64)
