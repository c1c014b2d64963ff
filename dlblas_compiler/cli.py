"""`dlblas-compiler`: the command line. `dlblas-compiler --help` lists the subcommands, `COMMAND --help` each one's.

opt    xdsl-opt with the `dl` dialect, the compiler's passes and the `triton` target (also `dl-opt`)
demo   compile and run a small Llama-style block, print the report and the error against float64 eager
tune   pre-tune a model's kernels on the GPU for a list of token counts (fills the persistent cache)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from xdsl.utils.exceptions import ArgSpecParseError
from xdsl.xdsl_opt_main import xDSLOptMain


class DLOptMain(xDSLOptMain):
    """xdsl-opt with the `dl` dialect, the compiler's passes (listed first) and the `triton` target registered."""

    def register_all_dialects(self) -> None:
        super().register_all_dialects()
        from .dialects import DL

        self.ctx.register_dialect("dl", lambda: DL)

    def register_all_passes(self) -> None:
        super().register_all_passes()
        from .passes import PASSES

        xdsl_passes = {name: f for name, f in self.available_passes.items() if name not in PASSES}
        self.available_passes = {**PASSES, **xdsl_passes}

    def register_all_targets(self) -> None:
        super().register_all_targets()
        from .lowering import TritonTarget

        self.available_targets[TritonTarget.name] = lambda: TritonTarget

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.prog = "dlblas-compiler opt"
        arg_parser.add_argument(
            "--mlir-print-ir-after-all",
            dest="print_between_passes",
            action="store_true",
            help="MLIR's spelling of --print-between-passes (the IR after the last pass is the output)",
        )

    def setup_pipeline(self) -> None:
        from .passes.registry import check_pipeline

        check_pipeline(self.args.passes, self.available_passes)  # one line for an unknown pass or option
        super().setup_pipeline()


def opt_main(argv: Sequence[str] | None = None) -> int:
    """`dlblas-compiler opt` (and `dl-opt`): xdsl-opt's arguments, `--help` lists them."""
    try:
        tool = DLOptMain(description="dl-opt: the dlblas_compiler IR optimizer", args=argv)
        tool.run()
    except (ValueError, ArgSpecParseError, OSError) as e:  # a bad -p pipeline, a file that cannot be read or written
        print(f"dlblas-compiler opt: {e}", file=sys.stderr)
        return 2
    return 0


def demo(args: argparse.Namespace) -> int:
    import torch

    from . import compile as dl_compile
    from .models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
    from .numerics import rel_error

    if args.backend == "triton" and not torch.cuda.is_available():
        print("dlblas-compiler demo: the triton backend runs on a CUDA GPU, and none is available (--backend "
              "interpret runs the same kernels on the CPU)", file=sys.stderr)  # fmt: skip
        return 1
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


def load_factory(spec: str) -> Callable:
    """`module:function` → the function, importing the module with the current directory on sys.path."""
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise ImportError(f"expected MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(mod_name)
    if not hasattr(module, fn_name):
        raise ImportError(f"module {mod_name!r} has no {fn_name!r}")
    return getattr(module, fn_name)


def tune(args: argparse.Namespace) -> int:
    import torch

    from . import compile as dl_compile

    try:
        factory = load_factory(args.factory)
    except ImportError as e:
        print(f"dlblas-compiler tune: cannot import the factory {args.factory!r}: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("dlblas-compiler tune: tuning times kernels on a CUDA GPU, and none is available", file=sys.stderr)
        return 1
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


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: a sequence length is at least 1")
    return n


def build_parser() -> argparse.ArgumentParser:
    """The parser of `dlblas-compiler`, one subcommand each (`opt`'s own arguments are xdsl-opt's)."""
    parser = argparse.ArgumentParser(
        prog="dlblas-compiler", description="Compile PyTorch modules to fused, tuned Triton kernels."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "opt",
        add_help=False,  # `opt --help` is xdsl-opt's
        help="run passes on an MLIR file, xdsl-opt style: opt FILE -p classify,fuse --print-between-passes "
        "(`opt --help` lists every option and pass)",
    )

    about = "compile and run a small Llama-style block; print the report and the error against float64 eager"
    p = sub.add_parser("demo", help=about, description=about)
    p.add_argument("--backend", default=None, choices=["triton", "interpret", "reference"],
                   help="default: triton with a CUDA GPU, else reference")  # fmt: skip
    p.add_argument("--tokens", type=_positive, default=8, help="sequence length (default 8)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--dump-ir", default=None, help="directory for the IR of every stage and the kernels")
    p.set_defaults(run=demo)

    about = "pre-tune a model's kernels on the GPU for a list of token counts, filling the persistent tuning cache"
    p = sub.add_parser("tune", help=about, description=about)
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="function returning (model, args, kwargs, ...) for (tokens, dtype, device); MODULE is "
                        "imported with the current directory on sys.path")  # fmt: skip
    p.add_argument("--tokens", default="1,16,128,2048", help="comma-separated token counts (default 1,16,128,2048)")
    p.add_argument("--mode", default="quick", choices=["quick", "full"], help="tuning mode (default quick)")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    p.set_defaults(run=tune)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from . import options

    options_file = options.__file__
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["opt"]:
        return opt_main(argv[1:])  # xdsl-opt parses its own arguments
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as e:  # (a bad option value, `--dump-ir` naming a file: one line, not a traceback)
        if traceback.extract_tb(e.__traceback__)[-1].filename != options_file:
            raise  # (any other ValueError keeps its traceback)
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
