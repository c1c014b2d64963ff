"""`dlblas-compiler`: opt (xdsl-opt with the `dl` dialect and passes), demo, tune, bench."""

from __future__ import annotations

import argparse
import sys

from xdsl.xdsl_opt_main import xDSLOptMain


class DLOptMain(xDSLOptMain):
    """xdsl-opt with the `dl` dialect, the compiler's passes and the `triton` target registered."""

    def register_all_dialects(self):
        super().register_all_dialects()
        from .dialects import DL

        self.ctx.register_dialect("dl", lambda: DL)

    def register_all_passes(self):
        super().register_all_passes()
        from .passes import PASSES

        for name, factory in PASSES.items():
            self.register_pass(name, factory)


def opt_main(argv: list[str] | None = None) -> int:
    DLOptMain(description="dl-opt: the dlblas_compiler IR optimizer", args=argv).run()
    return 0


def demo(argv: list[str]) -> int:
    import torch

    from . import compile as dl_compile
    from .models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
    from .numerics import rel_error

    p = argparse.ArgumentParser(prog="dlblas-compiler demo", description="compile and run a small Llama-style block")
    p.add_argument("--backend", default=None, choices=["triton", "interpret", "reference"])
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--dump-ir", default=None, help="directory for the IR of every stage and the kernels")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    device = "cuda" if torch.cuda.is_available() and args.backend in (None, "triton") else "cpu"
    cfg = BlockConfig()
    model = randomize_(LlamaBlock(cfg)).to(device=device, dtype=dtype).eval()
    x, cos, sin = llama_block_inputs(cfg, 1, args.tokens, dtype, device)
    cm = dl_compile(model, backend=args.backend, dump_ir=args.dump_ir)
    with torch.no_grad():
        out = cm(x, cos, sin)
        ref = model.double()(x.double(), cos.double(), sin.double())
    print(cm.report())
    err = rel_error(out, ref)
    print(f"relative error vs float64 eager: {err:.3e}  (max abs {(out.double() - ref).abs().max().item():.3e})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"opt": opt_main, "demo": demo}
    if not argv or argv[0] not in commands:
        print(f"usage: dlblas-compiler {{{','.join(commands)}}} ...", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
