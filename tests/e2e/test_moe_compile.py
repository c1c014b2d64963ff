"""MoE blocks through the compiler: captured as one `dl.moe` op, lowered to the MoE library kernels, and over a
process group to EPMoE (`dc.compile(..., expert_parallel=group)`).

Hugging Face Mixtral and Qwen2-MoE models from tiny random configs, and a hand-written block registered with
`register_moe_block`. Tolerances: the reference backend matches eager to 1e-6 (same torch ops in another order),
the interpreted Triton kernels (float32) to 1e-5 relative; EP over gloo matches the single-process reference on
each rank's shard to 1e-5 in float32 (`dl` tensors are f16/bf16/f32), with torch experts (reference
backend) and with the Triton kernels under the interpreter."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.frontend.moe import register_moe_block
from dlblas_compiler.library import moe_reference
from dlblas_compiler.numerics import rel_error

transformers = pytest.importorskip("transformers")


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def _mixtral_block(dtype=torch.float32):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)
    return _randomize(MixtralSparseMoeBlock(cfg)).to(dtype)


def _run(model, args, backend, kwargs=None):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        cm = dc.compile(model, backend=backend, cuda_graphs=False)
        return cm, cm(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_mixtral_block_is_one_moe_op(backend):
    block = _mixtral_block()
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = block.double()(x.double())
    block.float()
    cm, out = _run(block, (x,), backend)
    assert rel_error(out, ref) < 1e-5
    ir = cm.ir()
    assert ir.count("= dl.moe ") == 1 and "dl.torch_call" not in ir
    report = cm.report()
    assert "MoE blocks captured as dl.moe: MixtralSparseMoeBlock" in report
    assert "runs as the MoE library kernels" in report
    assert block.forward.__func__ is type(block).forward  # the block's own forward is back


def _tiny_causal_lm(kind: str):
    common = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    if kind == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM

        return MixtralForCausalLM(MixtralConfig(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, **common))
    if kind in ("qwen3_moe", "olmoe"):  # the router renormalizes (norm_topk_prob), no shared expert
        cls = transformers.Qwen3MoeForCausalLM if kind == "qwen3_moe" else transformers.OlmoeForCausalLM
        config = transformers.Qwen3MoeConfig if kind == "qwen3_moe" else transformers.OlmoeConfig
        extra = dict(head_dim=8) if kind == "qwen3_moe" else dict(pad_token_id=0, eos_token_id=0)
        return cls(config(intermediate_size=48, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                          norm_topk_prob=True, **extra, **common))  # fmt: skip
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(
        intermediate_size=48, moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=False, **common,
    )  # fmt: skip
    return Qwen2MoeForCausalLM(cfg)


@pytest.mark.parametrize("kind,backend", [("mixtral", "interpret"), ("qwen2_moe", "reference"), ("qwen2_moe", "interpret"),
                                          ("qwen3_moe", "interpret"), ("olmoe", "reference")])  # fmt: skip
def test_hf_moe_causal_lm_logits(kind, backend):
    model = _randomize(_tiny_causal_lm(kind), seed=2)
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    cm, out = _run(model, (ids,), backend, {"use_cache": False})
    assert rel_error(out.logits, ref) < 1e-5
    assert cm.ir().count("= dl.moe ") == 2  # one per layer; Qwen2-MoE's shared expert stays ordinary ops
    if kind != "mixtral":
        assert "MoE blocks captured as dl.moe: model.layers.0.mlp, model.layers.1.mlp" in cm.report()


def test_a_block_of_another_form_keeps_its_own_forward():
    """A recognized class whose experts are not `dl.moe`'s form (here GELU) is not swapped: the capture runs its
    own forward as ordinary ops, and the logits still equal eager's."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    cfg = Qwen3MoeConfig(intermediate_size=48, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, head_dim=8,
                         hidden_act="gelu", **common)  # fmt: skip
    model = _randomize(Qwen3MoeForCausalLM(cfg), seed=5)
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        cm = dc.compile(model, backend="reference", cuda_graphs=False)
        out = cm(ids, use_cache=False).logits
    assert rel_error(out, ref) < 1e-5
    assert "dl.moe" not in cm.ir()


class LoopMoE(nn.Module):
    """A hand-written Mixtral-style block: router, top-2, loop over experts."""

    def __init__(self, e=4, h=16, i=24, k=2):
        super().__init__()
        self.router = nn.Linear(h, e, bias=False)
        self.w_gate_up = nn.Parameter(torch.randn(e, 2 * i, h))
        self.w_down = nn.Parameter(torch.randn(e, h, i))
        self.k = k

    def forward(self, x):
        probs = torch.softmax(self.router(x).float(), -1)
        w, ids = torch.topk(probs, self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(self.w_gate_up.shape[0]):
            tok, slot = torch.where(ids == e)
            gate, up = F.linear(x[tok], self.w_gate_up[e]).chunk(2, -1)
            out.index_add_(0, tok, F.linear(F.silu(gate) * up, self.w_down[e]) * w[tok, slot, None])
        return out


register_moe_block(
    LoopMoE,
    lambda m: lambda x: torch.ops.dlblas.moe(x, m.router.weight, m.w_gate_up, m.w_down, m.k, True),
)


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.moe = LoopMoE()

    def forward(self, x):
        return x + self.moe(self.norm(x))


def test_registered_hand_written_block():
    model = _randomize(Wrapper(), seed=4)
    x = torch.randn(11, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(x)
    cm, out = _run(model, (x,), "interpret")
    assert rel_error(out, ref) < 1e-5
    assert cm.ir().count("= dl.moe ") == 1


def _ep_worker(rank: int, ws: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=ws)
    try:
        block = _mixtral_block()
        x = torch.randn(3, 8, 32, generator=torch.Generator().manual_seed(10 + rank))
        with torch.no_grad():
            ref = moe_reference(x.view(-1, 32), block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj, 2)
            for backend in ("reference", "interpret"):  # torch experts / the Triton kernels under the interpreter
                cm = dc.compile(block, backend=backend, expert_parallel=dist.group.WORLD)
                out = cm(x)
                torch.testing.assert_close(out.view(-1, 32), ref, rtol=1e-5, atol=1e-5)
                assert cm.ir().count("= dl.moe ") == 1
            # without expert_parallel a compiled MoE stays on its rank although torch.distributed is initialized:
            # with weights that differ per rank, an exchange with the default group would mix them
            own = _randomize(_mixtral_block(), seed=20 + rank)
            out = dc.compile(own, backend="interpret")(x)
            ref = moe_reference(x.view(-1, 32), own.gate.weight, own.experts.gate_up_proj, own.experts.down_proj, 2)
            torch.testing.assert_close(out.view(-1, 32), ref, rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


def test_expert_parallel_compile_over_gloo(tmp_path):
    mp.spawn(_ep_worker, args=(2, str(tmp_path / "init")), nprocs=2)


def test_expert_parallel_tokens_needs_a_group_and_a_positive_int():
    block = _mixtral_block()
    with pytest.raises(ValueError, match="give expert_parallel"):
        dc.compile(block, backend="reference", expert_parallel_tokens=64)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="expert_parallel_tokens must be a positive int"):
            dc.compile(block, backend="reference", expert_parallel=object(), expert_parallel_tokens=bad)


def _ep_peer_worker(rank: int, ws: int, init_file: str) -> None:
    """A compiled Mixtral block over NCCL with `expert_parallel_tokens`: the peer exchange inside the compiled
    program, run directly, then captured and replayed from its CUDA graph, with new tokens on every call."""
    import faulthandler
    from datetime import timedelta

    faulthandler.dump_traceback_later(150, exit=True)  # (a rank stuck in an exchange: its stack, then a failure)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=ws,
                            timeout=timedelta(seconds=60), device_id=device)
    try:
        block = _mixtral_block().to(device, torch.bfloat16)
        cm = dc.compile(block, backend="triton", expert_parallel=dist.group.WORLD, expert_parallel_tokens=24)
        g = torch.Generator().manual_seed(40 + rank)
        for call in range(4):  # direct, direct (capture from the second call of a signature), replays
            x = torch.randn(3, 8, 32, generator=g).to(device, torch.bfloat16)
            with torch.no_grad():
                out = cm(x)
            w = [t.float() for t in (block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj)]
            ref = moe_reference(x.view(-1, 32).float(), *w, 2)
            err = rel_error(out.view(-1, 32).float(), ref)
            assert err < 2e-2, f"rank {rank}, call {call}: rel err {err:.2e}"
        program = cm._spec().executor
        assert program.graph is not None or program.graphs_pay is False, "the program was never captured"
        assert "peer exchange" in repr(next(s for s in program.steps if type(s).__name__ == "MoEStep"))
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_expert_parallel_compile_with_the_peer_exchange_on_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    mp.spawn(_ep_peer_worker, args=(2, str(tmp_path / "init")), nprocs=2)
