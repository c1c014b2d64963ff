"""bench/replay_tuning.py: an exhaustive table split over two part files is merged, the space is rebuilt from
the file's record, and the quick search replayed over it finds what it finds over the same times in memory."""

import json
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import replay_tuning  # noqa: E402


def _valley(a: int, b: int) -> float | None:
    if (a, b) == (9, 9):
        return None  # failed when timed
    return 10.0 + abs(a - 7) + abs(b - 3)


def test_parts_merge_and_replay(tmp_path):
    params = {"a": list(range(10)), "b": list(range(10))}
    record = {"params": params, "default": {"a": 0, "b": 0}, "starts": [{"a": 6, "b": 3}], "starts_no_sweeps": []}
    keys = [(a, b) for a in range(10) for b in range(10) if (a + b) % 7]  # (the others: invalid, never timed)
    files = []
    for i in range(2):
        part = {"part": [i, 2], "names": ["a", "b"], "table": [[list(k), _valley(*k)] for k in keys[i::2]], **record}
        files.append(tmp_path / f"p{i}.json")
        files[-1].write_text(json.dumps({"blk[0] M=2048": part, "_run": {"card": "test"}}))
    merged = replay_tuning.merge([str(f) for f in files])
    assert list(merged) == ["blk[0] M=2048"] and len(merged["blk[0] M=2048"]["times"]) == len(keys)
    r = replay_tuning.replay(merged["blk[0] M=2048"]["record"], merged["blk[0] M=2048"]["times"], seeds=2)
    assert r["configs"] == len(keys) and r["failed"] == 1 and r["best_us"] == 10.0
    seeded = r["policies"]["quick"]
    assert seeded["worst"] == 1.0  # the start is one step from the best: the climb takes it
    assert all(v["mean"] >= 1.0 for v in r["policies"].values())
    assert replay_tuning.main([str(f) for f in files] + ["--seeds", "1", "--out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["blk[0] M=2048"]["best_us"] == 10.0
