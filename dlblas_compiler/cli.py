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

    def register_all_targets(self):
        super().register_all_targets()
        from .lowering import TritonTarget

        self.available_targets[TritonTarget.name] = lambda: TritonTarget


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


def tune(argv: list[str]) -> int:
    """Pre-tune a model's kernels for a list of token counts, filling the persistent tuning cache."""
    import importlib

    import torch

    from . import compile as dl_compile

    p = argparse.ArgumentParser(prog="dlblas-compiler tune", description=tune.__doc__)
    p.add_argument("factory", help="module:function returning (model, args, kwargs, ...) for (tokens, dtype, device)")
    p.add_argument("--tokens", default="1,16,128,2048", help="comma-separated token counts")
    p.add_argument("--mode", default="quick", choices=["quick", "full"])
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("dlblas-compiler tune: tuning times kernels on a CUDA GPU, and none is available", file=sys.stderr)
        return 1
    mod_name, _, fn_name = args.factory.partition(":")
    factory = getattr(importlib.import_module(mod_name), fn_name)
    for m in (int(t) for t in args.tokens.split(",")):
        model, call_args, call_kwargs = factory(m, getattr(torch, args.dtype), "cuda")[:3]
        cm = dl_compile(model, backend="triton", tune=args.mode)
        with torch.no_grad():
            cm(*call_args, **call_kwargs)
        print(f"tokens={m}")
        for k in cm.report().kernels:
            t = f"{k.time * 1e6:.1f} µs" if k.time else "-"
            print(f"  {k.region:16s} {k.impl:9s} {t:>10s} {'(cached)' if k.from_cache else ''} {k.config or {}}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"opt": opt_main, "demo": demo, "tune": tune}
    if not argv or argv[0] not in commands:
        print(f"usage: dlblas-compiler {{{','.join(commands)}}} ...", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
