"""An experiment for issue 19: would rotating q and k as adjacent pairs pay in the QKV GEMM's epilogue?

    python bench/rotary_pairs.py --out OUT [--tokens 2048]

Llama-3-8B's QKV+RoPE (no norm) is compiled as one generated GEMM kernel (`bench/gemms.py`'s QKVPiece). A second
kernel is made from its source by two edits: each tile's column j of a head loads W's row in pair order (the
head's columns j and j + 64 side by side: `rn` permuted), and the rotation reshapes the tile into [.., 64, 2]
pairs instead of [.., 2, 64] halves, so each partner is in the same thread's registers and the epilogue stores
each column back at its place. By pointer the W rows are gathered; with TMA (a third kernel, `paired_tma`) they
come through a 4-D descriptor of the weight as it is ([heads, 64, 2, K]), whose boxes are already in pair order.
Every config is checked against the unedited kernel's output and timed (CUDA-graph replay, L2 cleared). Writes
OUT/rotary_pairs.json (`--name`); `--tma-only` times the TMA configs alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

HALVES = "[BLOCK_M, BLOCK_N // 128, 2, 64]), [0, 1, 3, 2]"
PAIRS = "[BLOCK_M, BLOCK_N // 128, 64, 2]), [0, 1, 2, 3]"
PLAIN_RN = "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)"
PAIRED_RN = ("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N) // 128 * 128 + tl.arange(0, BLOCK_N) % 2 * 64"
             " + tl.arange(0, BLOCK_N) % 128 // 2")


def paired(source: str) -> str:
    """The kernel's source with the rows loaded in pair order and the whole-head rotation done on pairs."""
    out, after = [], False
    for line in source.splitlines():
        if HALVES in line:
            line, after = line.replace(HALVES, PAIRS), True
        elif after and "tl.join" in line:
            line, after = line.replace("[0, 1, 3, 2]), [BLOCK_M, BLOCK_N])", "[0, 1, 2, 3]), [BLOCK_M, BLOCK_N])"), False
        out.append(line.replace(PLAIN_RN, PAIRED_RN) if line.strip() == PLAIN_RN else line)
    text = "\n".join(out) + "\n"
    assert text.count(PAIRS) >= 3 and PAIRED_RN in text, "the generated source changed: update the edits"
    return text


TMA_DESC = ("tl.make_tensor_descriptor(w_ptr + 0 * K, shape=[GRID_N, K], strides=[K, 1],\n"
            "                                                 block_shape=[BLOCK_N, BLOCK_K])")
TMA_LOAD = "b0_desc.load([pid_n * BLOCK_N, k0])"
# W viewed [heads, 64, 2, K] (strides 128 K, K, 64 K, 1): box (h, j, s) is W's row h * 128 + s * 64 + j, so the
# box reshaped [BLOCK_N, BLOCK_K] has each head's rows j and j + 64 side by side: the pair order, loaded by TMA
PAIRED_DESC = ("tl.make_tensor_descriptor(w_ptr, shape=[GRID_N // 128, 64, 2, K], strides=[128 * K, K, 64 * K, 1],"
               " block_shape=[BLOCK_N // 128, 64, 2, BLOCK_K])")
PAIRED_LOAD = "tl.reshape(b0_desc.load([pid_n * (BLOCK_N // 128), 0, 0, k0]), [BLOCK_N, BLOCK_K])"


def paired_tma(source: str) -> str:
    """`paired`, with W's rows in pair order loaded through a 4-D TMA descriptor of the weight as it is."""
    text = paired(source)
    assert TMA_DESC in text and TMA_LOAD in text, "the generated TMA loads changed: update the edits"
    return text.replace(TMA_DESC, PAIRED_DESC).replace(TMA_LOAD, PAIRED_LOAD)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--tma-only", action="store_true", help="only TMA configs (pairs through a 4-D descriptor)")
    ap.add_argument("--name", default="rotary_pairs.json")
    args = ap.parse_args()
    from blocks import _randn
    from gemms import QKVPiece, graph_time_us, region_inputs

    import dlblas_compiler as dc
    from dlblas_compiler.codegen.kernel import compile_source
    from dlblas_compiler.models import randomize_, rope_cos_sin

    m = args.tokens
    mod = randomize_(QKVPiece(False, True, True)).to("cuda", torch.bfloat16).eval()
    x = _randn(1, m, QKVPiece.H, dtype=torch.bfloat16, device="cuda", seed=1)
    cos, sin = rope_cos_sin(m, QKVPiece.D, 500000.0, torch.bfloat16, "cuda")
    cm = dc.compile(mod, backend="triton", tune="none", cuda_graphs=False, prefer_kernels=True)
    rows = []
    with torch.no_grad():
        cm(x, cos, sin)
        (step, tensors), = region_inputs(cm, (x, cos, sin), {})
        k = step.kernel
        edited = compile_source(paired(k.source), k.name, interpret=False)
        edited_tma = compile_source(paired_tma(k.source), k.name, interpret=False)
        base = {"BLOCK_M": 128, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 8, "MM": 0, "NORM_PASS": 0, "WS": 0}
        for bn in (128, 256):
            for stages in (3, 4):
                for pers in (0, 1):
                    for tma in (1, 0):
                        cfg = {**base, "BLOCK_N": bn, "num_stages": stages, "PERSISTENT": pers, "TMA": tma}
                        if not k.space.is_valid(cfg):
                            continue
                        want = [o.float() for o in step.launch(tensors, cfg)]
                        row = {"config": cfg, "halves_us": graph_time_us(lambda c=cfg: step.launch(tensors, c))}
                        if not tma and not args.tma_only:
                            got = k.launch(edited, tensors, cfg)
                            row["pairs_rel_diff"] = max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(got, want))
                            row["pairs_us"] = graph_time_us(lambda c=cfg: k.launch(edited, tensors, c))
                        elif tma:
                            try:
                                got = k.launch(edited_tma, tensors, cfg)
                                row["pairs_rel_diff"] = max(((g.float() - r).norm() / r.norm()).item()
                                                            for g, r in zip(got, want))  # fmt: skip
                                row["pairs_us"] = graph_time_us(lambda c=cfg: k.launch(edited_tma, tensors, c))
                            except Exception as e:  # (a descriptor Triton cannot lower)
                                row["pairs_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        elif args.tma_only:
                            continue
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.name), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "M": m, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
