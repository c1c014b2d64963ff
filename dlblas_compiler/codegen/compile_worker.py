"""A compile worker: a process that builds Triton kernels into Triton's disk cache (`compile_pool` starts them).

Run as a script (`python -P compile_worker.py`), it imports Triton and nothing of this package (no torch: it
starts in a fraction of a second). It reads jobs from stdin and answers each on stdout, both pickled: a job is
(kernel file text, its module name, function name, file name, Triton's specialization data of one launch, target,
cache folder), its answer (None or the error's first line, the seconds it took). It compiles the function for that
specialization exactly as the launching process would (`JITFunction.preload`'s reading of the data, then
`triton.compile`), so the launching process, compiling the same launch afterwards, finds the binary in the cache
under the same key; for CUDA it also builds the kernel's launcher (a C module) there. It needs no GPU. The process
ends when stdin closes.
"""

from __future__ import annotations

import json
import linecache
import os
import pickle
import sys
import time
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend


def _function(text: str, module: str, name: str, filename: str, cache: dict[str, Any]) -> Any:
    """The jitted function `name` of a kernel file, built as `kernel.compile_source` builds it (the same text, file
    name and module name: the text and the function's first line enter its cache key, the file name its line info).
    The file is run once; its functions are looked up by name (a GEMM's file holds its Triton kernel and its
    warp-specialized Gluon twin: a file's first job must not answer for the other function)."""
    namespace = cache.get(text)
    if namespace is None:
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        namespace = cache[text] = {"triton": triton, "tl": tl, "__name__": module}
        exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - the launching process's generated kernel
    return namespace[name]


def _constant(v: Any) -> Any:
    if tl.dtype.is_dtype(v):
        return tl.dtype(v)
    return tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v


def compile_job(job: tuple, cache: dict[str, Any]) -> None:
    text, module, name, filename, data, target, cache_dir = job
    if cache_dir:
        triton.knobs.cache.dir = cache_dir
    fn = _function(text, module, name, filename, cache)
    spec = json.loads(data)
    constexprs = {tuple(k): _constant(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"], strict=True)}
    attrs = dict(zip(map(tuple, spec["attrs_keys"]), spec["attrs_vals"], strict=True))
    signature = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    target = GPUTarget(*target)
    options = make_backend(target).parse_options(options)
    source = (_gluon_source() if fn.is_gluon() else ASTSource)(fn, signature, constexprs, attrs)
    kernel = triton.compile(source, target=target, options=options.__dict__)
    if target.backend == "cuda":
        _launcher(kernel)


def _gluon_source() -> type:
    """Gluon's ASTSource (a Gluon kernel: a GEMM's warp-specialized one), as its JITFunction's binder picks it."""
    from triton.experimental.gluon._runtime import GluonASTSource

    return GluonASTSource


def _launcher(kernel: Any) -> None:
    """Build the kernel's launcher into the cache as well: a C module of its signature that Triton compiles with the
    host's C compiler at the kernel's first launch (~0.3 s each, one after another in the launching process: ~4 s of
    a 32-layer model's cold first call, bench/NOTES.md item 100). It is cached under its source, which the launching
    process makes the same. Loading it here may fail (no driver library on a CPU host): the build is kept."""
    from triton.backends.nvidia.driver import CudaLauncher

    try:
        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001, S110 - an optimisation: the first launch builds what is missing
        pass


def main() -> None:
    cache: dict[str, Any] = {}
    inp, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # (anything else written to stdout, by Triton or its C++ side, goes to stderr: not the answers)
    while True:
        try:
            job = pickle.load(inp)
        except EOFError:
            return
        start = time.perf_counter()
        try:
            compile_job(job, cache)
            error = None
        except Exception as e:  # noqa: BLE001 - the launching process compiles it again and reports it
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        pickle.dump((error, time.perf_counter() - start), out)
        out.flush()


if __name__ == "__main__":
    main()
