"""`tuning.Lockstep`: searches as threads taking turns, their compile waits gathered into shared batches."""

import threading
import time

import pytest

from dlblas_compiler.tuning import Lockstep


def _tasks(lockstep: Lockstep, rounds: dict[str, int], log: list, running: list):
    """A task per name waiting `rounds[name]` times for jobs named after it and the round; each records when it
    runs (checking no other task runs at the same time)."""

    def task(name: str):
        def run() -> None:
            for r in range(rounds[name]):
                running.append(name)
                assert len(running) == 1, running  # (one task at a time outside its waits)
                time.sleep(0.001)
                log.append((name, "runs", r))
                running.remove(name)
                lockstep.wait([f"{name}{r}"])
                log.append((name, "built", r))

        return run

    return [task(n) for n in rounds]


def test_waiting_tasks_share_each_batch_and_run_one_at_a_time():
    batches: list[list] = []
    lockstep = Lockstep(lambda jobs: batches.append(sorted(jobs)))
    log: list = []
    lockstep.run(_tasks(lockstep, {"a": 3, "b": 1, "c": 2}, log, []))
    # every task's first round in one batch; then the ones still running, and so on
    assert batches == [["a0", "b0", "c0"], ["a1", "c1"], ["a2"]]
    assert lockstep.batches == [3, 2, 1]
    for name, rounds in {"a": 3, "b": 1, "c": 2}.items():
        mine = [e for e in log if e[0] == name]
        assert mine == [e for r in range(rounds) for e in ((name, "runs", r), (name, "built", r))]


def test_a_task_s_error_is_raised_after_the_others_end():
    batches: list[list] = []
    lockstep = Lockstep(lambda jobs: batches.append(sorted(jobs)))
    done = []

    def fails() -> None:
        lockstep.wait(["x"])
        raise ValueError("candidate")

    def goes_on() -> None:
        lockstep.wait(["y"])
        lockstep.wait(["z"])
        done.append(True)

    with pytest.raises(ValueError, match="candidate"):
        lockstep.run([fails, goes_on])
    assert done == [True] and batches == [["x", "y"], ["z"]]


def test_a_failing_build_releases_the_waiting_tasks():
    def build(jobs):
        raise RuntimeError("workers gone")

    lockstep = Lockstep(build)
    ran = []
    lockstep.run([lambda: (lockstep.wait(["a"]), ran.append(1)), lambda: (lockstep.wait(["b"]), ran.append(2))])
    assert sorted(ran) == [1, 2] and lockstep.batches == [2]


def test_nothing_is_built_while_a_task_runs():
    """A batch starts only once every task still running waits: a task's work never overlaps a build."""
    busy = threading.Event()
    overlaps = []

    def build(jobs):
        overlaps.append(busy.is_set())

    lockstep = Lockstep(build)

    def slow() -> None:
        lockstep.wait(["s"])
        busy.set()
        time.sleep(0.05)
        busy.clear()
        lockstep.wait(["t"])

    lockstep.run([slow, lambda: lockstep.wait(["q"])])
    assert overlaps == [False, False]


def test_an_interrupted_caller_cancels_the_tasks():
    """Ctrl-C in the calling thread while the tasks wait for a batch: `run` raises it at once, and each task stops
    at its next wait instead of going on with its search in the background."""
    import signal

    went_on = []

    def build(jobs):
        time.sleep(0.4)

    lockstep = Lockstep(build)

    def task() -> None:
        lockstep.wait(["a"])
        went_on.append(True)  # (never: the wait raises Cancelled)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(KeyboardInterrupt):
            lockstep.run([task, task])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    deadline = time.time() + 5
    while any(t.name.startswith("dlblas-tune-") for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.01)
    assert not any(t.name.startswith("dlblas-tune-") for t in threading.enumerate())
    assert went_on == []


def test_tasks_see_the_caller_s_context_variables():
    """Each task runs in a copy of the calling thread's context (Triton keeps its allocator in a context variable:
    a search's launches must find the one the caller set); what a task sets stays its own."""
    import contextvars

    var = contextvars.ContextVar("var", default="unset")
    var.set("caller's")
    seen: list[str] = []

    def task() -> None:
        seen.append(var.get())
        var.set("task's")

    Lockstep(lambda jobs: None).run([task, task])
    assert seen == ["caller's", "caller's"] and var.get() == "caller's"
