"""Several searches at once, in step: their compiles batched together, their timings one at a time.

A quick search waits for a batch of up to 8 compiles several times, and each wait lasts as long as the batch's
slowest compile while most of the host's cores idle (bench/NOTES.md items 89, 90). `Lockstep.run` runs the searches
of several regions as threads that take turns: one holds the turn at a time, so a search's own Python and its
timings never run beside another's (timings of short kernels disturbed by the host chose worse kernels, item 89).
A search hands its turn over only while it waits for compiles (`wait(jobs)`); once every search still running
waits, all their jobs are built as one batch (`build`, the compile workers), nothing being timed meanwhile, and
then the searches go on, one at a time. Each search makes the same proposals it would make alone (its policy sees
only its own results), so tuning this way changes when things compile, not what is chosen. When the calling
thread is interrupted (Ctrl-C) the tasks are cancelled: each stops at its next wait or turn (`Cancelled`). Each
task runs in a copy of the calling thread's context variables.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any


class Cancelled(BaseException):
    """Raised inside a task at its next wait or turn once its lockstep was cancelled (not an `Exception`: the
    searches' handlers of failing candidates and preparations must let it through)."""


class Lockstep:
    """Runs tasks in threads taking turns; `wait(jobs)` inside a task gathers its jobs into the next batch."""

    def __init__(self, build: Callable[[list], Any]) -> None:
        self._build = build
        self._turn = threading.Lock()
        self._state = threading.Condition()
        self._running = 0
        self._waiting: list[list] = []  # the jobs of each task waiting for the next batch
        self._batch = 0  # batches built so far
        self._cancelled = False
        self.batches: list[int] = []  # jobs per batch built (for reports and tests)

    def run(self, tasks: list[Callable[[], None]]) -> None:
        """Run every task to its end (one at a time but while they wait); the first exception a task raised is
        raised after all have ended."""
        errors: list[BaseException] = []

        def body(task: Callable[[], None]) -> None:
            self._turn.acquire()
            try:
                if self._cancelled:
                    raise Cancelled
                task()
            except Cancelled:
                pass
            except BaseException as e:  # noqa: BLE001 - raised in the calling thread below
                errors.append(e)
            finally:
                self._turn.release()
                with self._state:
                    self._running -= 1
                    self._build_if_all_wait()

        self._running = len(tasks)
        # (each task in a copy of the caller's context: context variables it set, such as Triton's allocator,
        # hold in the tasks as in a call made where it stands)
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(body, t), name=f"dlblas-tune-{i}",
                                    daemon=True) for i, t in enumerate(tasks)]  # fmt: skip
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException:  # (KeyboardInterrupt): each task stops at its next wait; none starts its search
            self._cancelled = True
            with self._state:
                self._state.notify_all()
            raise
        if errors:
            raise errors[0]

    def wait(self, jobs: list) -> None:
        """From a task holding its turn: give the turn up until `jobs` (with every other waiting task's) are built."""
        with self._state:
            self._waiting.append(list(jobs))
            batch = self._batch
            self._turn.release()
            self._build_if_all_wait()
            while self._batch == batch and not self._cancelled:
                self._state.wait()
        self._turn.acquire()  # (also when cancelled: the task's end releases it)
        if self._cancelled:
            raise Cancelled

    def _build_if_all_wait(self) -> None:
        """(Holding `_state`.) Build the waiting tasks' jobs once no task is running; none can start meanwhile."""
        if not self._waiting or len(self._waiting) < self._running:
            return
        jobs = [job for waiting in self._waiting for job in waiting]
        self._waiting = []
        self._state.release()  # (every task still running waits for this batch: nothing else changes the state)
        try:
            if jobs:
                self._build(jobs)
        except Exception:  # noqa: BLE001, S110 - a batch is an optimisation: each launch compiles what is missing
            pass
        finally:
            self._state.acquire()
            self.batches.append(len(jobs))
            self._batch += 1
            self._state.notify_all()
