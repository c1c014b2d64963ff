"""The persistent tuning cache: round trip, keys, bucketing, concurrent writers, corrupt and old files."""

import dataclasses
import multiprocessing
import os
import sqlite3
import warnings

import pytest
import torch

from dlblas_compiler.tuning import CacheEntry, CacheKey, TuneCache, bucket, default_path, device_fingerprint
from dlblas_compiler.tuning.cache import SCHEMA_VERSION


def make_key(**changes) -> CacheKey:
    key = CacheKey.make("matmul_epilogue", "abc123", {"M": 16, "N": 4096, "K": 4096}, [torch.float16], "cpu", "sp")
    return dataclasses.replace(key, **changes)


def entry(i: int = 0) -> CacheEntry:
    return CacheEntry({"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "i": i}, 1.5e-5 + i * 1e-9, 2.5e-5, 24)


def test_round_trip_and_reopen(tmp_path):
    path = tmp_path / "tune.sqlite"
    cache = TuneCache(path)
    assert cache.get(make_key()) is None
    first = entry(1)
    cache.put(make_key(), first)
    assert cache.get(make_key()) == first
    assert TuneCache(path).get(make_key()) == first  # another instance (as another process would see it)
    cache.put(make_key(), entry(2))  # replaces
    assert TuneCache(path).get(make_key()).config["i"] == 2 and len(cache) == 1
    cache.put(make_key(kernel="softmax"), entry(3))
    stats = cache.stats()
    assert stats["entries"] == 2 and stats["kernels"] == {"matmul_epilogue": 1, "softmax": 1}
    assert stats["path"] == str(path) and stats["bytes"] > 0
    cache.clear()
    assert len(cache) == 0 and cache.get(make_key()) is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("kernel", "other"),
        ("source_hash", "abc124"),
        ("shape", (("K", 4096), ("M", 32), ("N", 4096))),
        ("dtypes", ("torch.bfloat16",)),
        ("device_name", "NVIDIA H200"),
        ("capability", "sm_80"),
        ("triton_version", "3.5.0"),
        ("torch_version", "2.9.0"),
        ("space", "narrowed"),
    ],
)
def test_every_key_field_changes_the_digest(field, value):
    assert make_key().digest() == make_key().digest()
    assert make_key(**{field: value}).digest() != make_key().digest()


def test_make_buckets_token_dims_and_reads_versions():
    import triton

    def key(m, dtypes=(torch.float16,), device="cpu"):
        return CacheKey.make("k", "h", {"M": m, "K": 4096}, dtypes, device, token_dims=("M",))

    assert key(13).digest() == key(16).digest() != key(17).digest()
    assert key(16).shape == (("K", 4096), ("M", 16))
    assert key(16).digest() != key(16, dtypes=(torch.float32,)).digest()
    assert key(16).digest() != key(16, device="interpret").digest()
    assert key(16).triton_version == triton.__version__ and key(16).torch_version == torch.__version__
    exact = CacheKey.make("k", "h", {"M": 13, "K": 4096}, [torch.float16], "cpu")
    assert exact.shape == (("K", 4096), ("M", 13))  # only token dims are bucketed


def test_bucket():
    buckets = [bucket(n) for n in range(1, 8193)]
    assert all(b >= n and b < 2 * n and b & (b - 1) == 0 for n, b in zip(range(1, 8193), buckets, strict=True))
    assert sorted(set(buckets)) == [1 << i for i in range(14)]
    assert (bucket(1), bucket(2), bucket(3), bucket(5), bucket(8192), bucket(8193)) == (1, 2, 4, 8, 8192, 16384)


def test_device_fingerprint():
    cpu, interp = device_fingerprint("cpu"), device_fingerprint("interpret")
    assert cpu.capability == "cpu" and interp.capability == "interpret" and cpu.name != interp.name
    assert device_fingerprint(torch.device("cpu")) == cpu


@pytest.mark.gpu
def test_device_fingerprint_cuda():
    fp = device_fingerprint("cuda")
    major, minor = torch.cuda.get_device_capability()
    assert fp.name == torch.cuda.get_device_name() and fp.capability == f"sm_{major}{minor}"
    assert device_fingerprint("cuda:0") == fp


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "d"))
    assert default_path() == tmp_path / "d" / "tune.sqlite"
    monkeypatch.delenv("DLBLAS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_path() == tmp_path / "x" / "dlblas_compiler" / "tune.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert default_path() == tmp_path / "h" / ".cache" / "dlblas_compiler" / "tune.sqlite"


def _writer(path: str, worker: int, n: int, start) -> None:
    cache = TuneCache(path)
    start.wait()  # both create the file and write at once
    for i in range(n):
        cache.put(make_key(kernel=f"k{worker}", source_hash=str(i)), entry(worker * 1000 + i))


def test_two_processes_writing_at_once(tmp_path):
    path = str(tmp_path / "tune.sqlite")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, w, 200, start)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = TuneCache(path)
    assert len(cache) == 400 and cache.stats()["kernels"] == {"k1": 200, "k2": 200}
    for w in (1, 2):
        for i in range(200):
            assert cache.get(make_key(kernel=f"k{w}", source_hash=str(i))).config["i"] == w * 1000 + i


def _asides(path):
    return sorted(p.name for p in path.parent.iterdir() if ".corrupt-" in p.name)


def test_corrupt_file_is_moved_aside_and_rebuilt(tmp_path):
    path = tmp_path / "tune.sqlite"
    path.write_bytes(os.urandom(8192))
    cache = TuneCache(path)
    with pytest.warns(UserWarning, match="not a readable database"):
        assert cache.get(make_key()) is None
    assert any(name.startswith("tune.sqlite.corrupt-") for name in _asides(path))
    cache.put(make_key(), entry(5))
    assert TuneCache(path).get(make_key()).config["i"] == 5


@pytest.mark.parametrize("value", ["not json", '{"config": {}}', '[1, 2]'])
def test_an_unreadable_entry_is_dropped_with_a_warning(tmp_path, value):
    """A row whose value is not an entry (written by hand, or by a version with other fields) is a miss, tuned again,
    with a warning (before: JSONDecodeError or TypeError from every lookup of that key)."""
    path = tmp_path / "tune.sqlite"
    cache = TuneCache(path)
    cache.put(make_key(), entry())
    with sqlite3.connect(path) as db:
        db.execute("UPDATE entries SET value = ?", (value,))
    with pytest.warns(UserWarning, match="unreadable entry for matmul_epilogue is dropped"):
        assert cache.get(make_key()) is None
    assert len(cache) == 0
    again = entry(4)
    cache.put(make_key(), again)
    assert cache.get(make_key()) == again


def test_damaged_pages_are_detected_and_rebuilt(tmp_path):
    path = tmp_path / "tune.sqlite"
    cache = TuneCache(path)
    cache.put(make_key(), entry(1))
    cache.close()
    with open(path, "r+b") as f:  # keep the SQLite header, smash the pages
        f.seek(100)
        f.write(os.urandom(path.stat().st_size - 100))
    with pytest.warns(UserWarning, match="tuning cache"):
        assert TuneCache(path).get(make_key()) is None
    assert _asides(path)


def test_file_corrupted_while_open_is_rebuilt_on_next_use(tmp_path):
    path = tmp_path / "tune.sqlite"
    cache = TuneCache(path)
    cache.put(make_key(), entry(1))
    other = TuneCache(path)  # another writer, so `cache` has to read the file again
    other.put(make_key(kernel="other"), entry(2))
    other.close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything into the main file, which we then destroy
    raw.close()
    path.write_bytes(os.urandom(path.stat().st_size))
    with pytest.warns(UserWarning, match="not a readable database"):
        assert cache.get(make_key()) is None
    cache.put(make_key(), entry(3))
    assert TuneCache(path).get(make_key()).config["i"] == 3 and _asides(path)


@pytest.mark.parametrize(
    "version, schema", [(0, "CREATE TABLE cache (key TEXT, value BLOB)"), (SCHEMA_VERSION + 1, None)]
)
def test_old_or_unknown_schema_is_rebuilt(tmp_path, version, schema):
    path = tmp_path / "tune.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(schema or "CREATE TABLE entries (digest TEXT PRIMARY KEY, value TEXT)")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
    with pytest.warns(UserWarning, match=f"schema version {version}"):
        TuneCache(path).put(make_key(), entry(7))
    assert _asides(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is accepted silently
        assert TuneCache(path).get(make_key()).config["i"] == 7


def test_threads_share_one_cache(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    cache = TuneCache(tmp_path / "tune.sqlite")

    def write(worker):
        for i in range(50):
            cache.put(make_key(kernel=f"t{worker}", source_hash=str(i)), entry(i))
            assert cache.get(make_key(kernel=f"t{worker}", source_hash=str(i))).config["i"] == i

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))
    assert len(cache) == 200
