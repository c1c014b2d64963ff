"""The persistent tuning cache: one SQLite file shared by every process on the machine.

Default location: `$DLBLAS_CACHE_DIR/tune.sqlite`, else `$XDG_CACHE_HOME/dlblas_compiler/tune.sqlite`, else
`~/.cache/dlblas_compiler/tune.sqlite`. The file is opened in WAL mode with a busy timeout and every write is
one transaction, so processes tuning at once lose or tear nothing. A file that is not a readable database of
this schema version is renamed `<file>.corrupt-<timestamp>` and rebuilt, with a warning.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .space import Config

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE entries (
    digest  TEXT PRIMARY KEY,  -- CacheKey.digest()
    kernel  TEXT NOT NULL,
    key     TEXT NOT NULL,     -- the CacheKey as JSON
    value   TEXT NOT NULL,     -- the CacheEntry as JSON
    updated REAL NOT NULL
)
"""
_BUSY_TIMEOUT_S = 60.0


def bucket(n: int) -> int:
    """The power-of-two bucket of a token-count dimension: the smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class DeviceFingerprint(NamedTuple):
    name: str
    capability: str


def device_fingerprint(device: str | torch.device) -> DeviceFingerprint:
    """Name and compute capability of a device: the CUDA device's name and `sm_XY`; for "cpu" and
    "interpret" (the Triton interpreter) the backend and the host's machine type."""
    if str(device) == "interpret":
        return DeviceFingerprint(f"interpret:{platform.machine()}", "interpret")
    dev = torch.device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device() if dev.index is None else dev.index)
        return DeviceFingerprint(props.name, f"sm_{props.major}{props.minor}")
    return DeviceFingerprint(f"{dev.type}:{platform.machine()}", dev.type)


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """Everything a tuned config depends on. `space` is the search space's fingerprint, so a result found in
    a narrowed space is not served to a wider one."""

    kernel: str
    source_hash: str
    shape: tuple[tuple[str, Any], ...]
    dtypes: tuple[str, ...]
    device_name: str
    capability: str
    triton_version: str
    torch_version: str
    space: str = ""

    @classmethod
    def make(
        cls,
        kernel: str,
        source_hash: str,
        shape: Mapping[str, Any],
        dtypes: Iterable[Any],
        device: str | torch.device,
        space: str = "",
        token_dims: Iterable[str] = (),
    ) -> CacheKey:
        """The key for this machine's Triton/torch versions; the dims named in `token_dims` are bucketed."""
        import triton

        token_dims = set(token_dims)
        dims = tuple(sorted((k, bucket(v) if k in token_dims else v) for k, v in shape.items()))
        fp = device_fingerprint(device)
        dtypes = tuple(str(d) for d in dtypes)
        return cls(
            kernel, source_hash, dims, dtypes, fp.name, fp.capability, triton.__version__, torch.__version__, space
        )

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """A tuning result: the best config, its time and the default config's time (seconds), trials run."""

    config: Config
    time: float
    default_time: float | None
    trials: int
    timestamp: float = dataclasses.field(default_factory=time.time)


def default_path() -> Path:
    if os.environ.get("DLBLAS_CACHE_DIR"):
        return Path(os.environ["DLBLAS_CACHE_DIR"]) / "tune.sqlite"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dlblas_compiler" / "tune.sqlite"


class _Unusable(Exception):
    """The file is not a database of this schema (its message says why)."""


def _is_corruption(e: sqlite3.DatabaseError) -> bool:
    return (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock (flock on a side file) around opening, checking and rebuilding."""
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class TuneCache:
    """Tuning results on disk, keyed by `CacheKey.digest()`; safe for concurrent processes and threads."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._lock = threading.RLock()  # one connection per process, used by one thread at a time

    def get(self, key: CacheKey) -> CacheEntry | None:
        row = self._run(lambda c: c.execute("SELECT value FROM entries WHERE digest = ?", (key.digest(),)).fetchone())
        if row is None:
            return None
        try:
            return CacheEntry(**json.loads(row[0]))
        except (ValueError, TypeError):  # (a row written by hand, or by a version with other fields: tuned again)
            warnings.warn(f"tuning cache {self.path}: an unreadable entry for {key.kernel} is dropped", stacklevel=2)
            self.delete(key)
            return None

    def put(self, key: CacheKey, entry: CacheEntry) -> None:
        row = (key.digest(), key.kernel, json.dumps(dataclasses.asdict(key)), json.dumps(dataclasses.asdict(entry)))
        self._write("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?)", (*row, entry.timestamp))

    def delete(self, key: CacheKey) -> None:
        self._write("DELETE FROM entries WHERE digest = ?", (key.digest(),))

    def clear(self) -> None:
        self._write("DELETE FROM entries", ())

    def stats(self) -> dict[str, Any]:
        """The file's path and size, the number of entries, and entries per kernel."""
        rows = self._run(lambda c: c.execute("SELECT kernel, COUNT(*) FROM entries GROUP BY kernel").fetchall())
        kernels = dict(rows)
        size = sum(p.stat().st_size for p in self._files() if p.exists())
        return {"path": str(self.path), "bytes": size, "entries": sum(kernels.values()), "kernels": kernels}

    def __len__(self) -> int:
        return self._run(lambda c: c.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def _write(self, sql: str, params: tuple) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(sql, params)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        self._run(txn)

    def _run(self, op):
        """Run `op(connection)`; if the file turns out corrupt, rebuild it and run `op` once more."""
        with self._lock:
            try:
                return op(self._connection())
            except sqlite3.DatabaseError as e:
                if not _is_corruption(e):
                    raise
                self.close()
                return op(self._connection())

    def _connection(self) -> sqlite3.Connection:
        """This process's connection, opened (and the file checked, or rebuilt) on first use."""
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            try:
                conn = self._open()
            except _Unusable as why:
                aside = self._move_aside()
                warnings.warn(
                    f"tuning cache {self.path}: {why}; moved it to {aside} and started a new one", stacklevel=4
                )
                conn = self._open()
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise _Unusable(f"integrity check failed ({check})")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(_SCHEMA)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            elif version != SCHEMA_VERSION or tables != {"entries"}:
                raise _Unusable(f"schema version {version} with tables {sorted(tables)}, expected {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as e:
            conn.close()
            if _is_corruption(e):
                raise _Unusable(f"not a readable database ({e})") from e
            raise
        except _Unusable:
            conn.close()
            raise
        return conn

    def _files(self) -> list[Path]:
        return [self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm"))]

    def _move_aside(self) -> Path:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        for src in self._files():
            if src.exists():
                src.rename(aside.with_name(aside.name + src.name[len(self.path.name) :]))
        return aside
