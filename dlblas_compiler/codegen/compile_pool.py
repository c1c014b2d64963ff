"""Compiling a tuning batch's candidates in worker processes, into Triton's disk cache.

A search proposes up to 8 configs of a kernel at a time and waits for all of them to compile before timing any.
In threads (Triton's `AsyncCompileMode`) 3-4 compiles ran at once on a 16-core host (bench/NOTES.md item 89):
the part of each compile that walks the kernel's Python AST holds the interpreter lock. Worker processes share
no lock: `prebuild` asks Triton what each config's launch would compile (its specialization data, through
Triton's `knobs.runtime.jit_cache_hook`, compiling nothing), hands each to a worker (`compile_worker.py`, which imports
Triton alone) and waits; each worker writes its binary into Triton's disk cache, where the launching process's
own compile of the same launch then finds it. Nothing depends on the workers for correctness: a launch whose
binary is not in the cache (a worker that failed or died, a key that differs) compiles in this process as before.

`DLBLAS_COMPILE_WORKERS` sets how many workers (default: one per CPU core the process may use, shared among the
processes torchrun started on the host, at most 16; 0: none). They start on a GPU process's first tuning batch and
end with it; a worker that dies or hangs is replaced, and after 8 such the process compiles alone.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

from ..logs import get_logger

__all__ = ["STATS", "WORKERS_ENV", "Sm90Driver", "Stats", "build", "compiles", "prebuild", "shutdown"]

WORKERS_ENV = "DLBLAS_COMPILE_WORKERS"
_WORKER = Path(__file__).with_name("compile_worker.py")
_log = get_logger("tuning")


def _count() -> int:
    """`DLBLAS_COMPILE_WORKERS`, else the CPU cores this process may run on shared with the other processes of
    its host that torchrun started (`LOCAL_WORLD_SIZE`), at most 16; none where Triton compiles every launch
    anyway (`TRITON_ALWAYS_COMPILE`)."""
    value = os.environ.get(WORKERS_ENV)
    if value:
        return max(0, int(value))
    if knobs.compilation.always_compile:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(16, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))))


class _Pool:
    """Worker processes, each answering one job at a time over its pipes."""

    MAX_DEATHS = 8  # workers that may end before the pool gives up (`broken`)
    TIMEOUT_S = 180  # a compile taking longer is given up (its launch compiles it in the process)

    def __init__(self, n: int) -> None:
        self._procs = [self._start() for _ in range(n)]
        self._idle: SimpleQueue[subprocess.Popen] = SimpleQueue()
        for p in self._procs:
            self._idle.put(p)
        self._threads = ThreadPoolExecutor(n, thread_name_prefix="dlblas-compile-worker")
        self._lock = threading.Lock()
        self.deaths = 0

    @staticmethod
    def _start() -> subprocess.Popen:
        # (-P: the script's folder, this package's codegen/, is not put on the worker's import path)
        return subprocess.Popen([sys.executable, "-P", str(_WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)  # fmt: skip

    @property
    def broken(self) -> bool:
        return self.deaths >= self.MAX_DEATHS

    def _run(self, job: tuple) -> tuple[str | None, float]:
        proc = self._idle.get()
        try:
            pickle.dump(job, proc.stdin)
            proc.stdin.flush()
            if not select.select([proc.stdout], [], [], self.TIMEOUT_S)[0]:
                raise TimeoutError(f"no answer in {self.TIMEOUT_S} s")
            error, seconds = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as e:  # died, garbled, hung
            proc.kill()
            with self._lock:
                self.deaths += 1
                self._procs.remove(proc)
                try:
                    proc = self._start()
                    self._procs.append(proc)
                except OSError:
                    self.deaths = self.MAX_DEATHS
            self._idle.put(proc)  # (a dead one when none could start: the next job finds it dead at once)
            return f"the compile worker ended ({type(e).__name__})", 0.0
        self._idle.put(proc)
        return error, seconds

    def run(self, jobs: list[tuple]) -> list[tuple[str | None, float]]:
        return list(self._threads.map(self._run, jobs))

    def close(self) -> None:
        for p in self._procs:
            try:
                p.stdin.close()  # (a worker ends when its stdin closes)
            except OSError:
                pass
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        self._threads.shutdown(wait=False)


class Sm90Driver:
    """Triton's driver as a process on an H100 sees it, without a GPU and launching nothing: made active
    (`triton.runtime.driver.set_active`), the warm-up launches that `prebuild` collects build sm90 binaries on any
    machine (the compile-pool tests, bench/kernel_resources.py)."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)


@dataclass
class Stats:
    """What the workers did in this process: batches, compiles (failed ones among them), the compiles' seconds
    summed, the slowest compile of each batch summed, and the batches' wall time (their compiles, the dispatch)."""

    batches: int = 0
    compiles: int = 0
    failed: int = 0
    compile_s: float = 0.0
    slowest_s: float = 0.0
    wall_s: float = 0.0

    def add(self, jobs: int, failed: int, seconds: list[float], wall: float) -> None:
        self.batches += 1
        self.compiles += jobs
        self.failed += failed
        self.compile_s += sum(seconds)
        self.slowest_s += max(seconds, default=0.0)
        self.wall_s += wall


STATS = Stats()
_pool: _Pool | None = None
_pool_lock = threading.Lock()
_collect_lock = threading.Lock()
_given_up = False  # the workers kept ending or could not start: this process compiles alone


def _get_pool() -> _Pool | None:
    global _pool, _given_up
    with _pool_lock:
        if _pool is not None and _pool.broken:
            _log.info("compile workers kept ending: compiling in this process")
            _pool.close()
            _pool, _given_up = None, True
        if _pool is None:
            n = 0 if _given_up else _count()
            if n == 0:
                return None
            try:
                _pool = _Pool(n)
            except OSError as e:
                _log.info("compile workers could not start (%s): compiling in this process", e)
                _given_up = True
                return None
            atexit.register(_pool.close)
        return _pool


def shutdown() -> None:
    """End the workers now (they also end with the process)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


def _collect(warm: Callable[[], None]) -> list[tuple[Any, str]]:
    """(jitted function, specialization data) of each warm-up compile `warm()` would do on this thread, compiling
    none: Triton's JIT calls `knobs.runtime.jit_cache_hook` before a compile and skips it when the hook returns
    True. A launch that is not a warm-up (a row pass a GEMM's launch runs before its kernel) compiles and runs as
    always: skipped, it would not run, and its launcher would keep no binary. The hook is set only while `warm()`
    runs; a compile on another thread meanwhile goes to the hook set before."""
    found: list[tuple[Any, str]] = []
    me = threading.current_thread()
    with _collect_lock:
        before = knobs.runtime.jit_cache_hook

        def hook(*, fn: Any, compile: dict, is_manual_warmup: bool, **kwargs: Any) -> Any:
            if threading.current_thread() is not me or not is_manual_warmup:
                return before(fn=fn, compile=compile, is_manual_warmup=is_manual_warmup, **kwargs) if before else None
            found.append((fn.jit_function, compile["specialization_data"]))
            return True

        knobs.runtime.jit_cache_hook = hook
        try:
            warm()
        finally:
            knobs.runtime.jit_cache_hook = before
    return found


def prebuild(warm: Callable[[], None]) -> int:
    """Compile in the workers what `warm()` (warm-up launches: `fn.run(..., warmup=True)`) would compile here, and
    wait for them: the warm-ups that follow find their binaries in Triton's disk cache. Returns how many compiles
    the workers completed (0 without workers, or for launches this process has already compiled)."""
    return build(compiles(warm))


def compiles(warm: Callable[[], None]) -> list[tuple]:
    """The worker jobs for what `warm()` would compile here (none without workers): `build` runs them; jobs of
    several `warm`s can be run as one batch."""
    if _get_pool() is None:
        return []
    found = _collect(warm)
    target = driver.active.get_current_target()
    jobs = []
    for fn, data in found:
        text, module, name, filename = getattr(fn, "dlblas_source", (None,) * 4)
        if text is not None:  # (one of our generated kernels; another function compiles here)
            arch = (target.backend, target.arch, target.warp_size)
            jobs.append((text, module, name, filename, data, arch, knobs.cache.dir))
    return jobs


def build(jobs: list[tuple]) -> int:
    """Run `compiles`' jobs in the workers and wait for them; how many completed."""
    pool = _get_pool()
    if pool is None or not jobs:
        return 0
    start = time.perf_counter()
    answers = pool.run(jobs)
    failed = [error for error, _ in answers if error is not None]
    STATS.add(len(jobs), len(failed), [s for _, s in answers], time.perf_counter() - start)
    if failed:
        _log.debug("%d of %d worker compiles failed (first: %s); they compile here", len(failed), len(jobs), failed[0])
    return len(jobs) - len(failed)
