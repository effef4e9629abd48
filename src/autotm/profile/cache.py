"""The profiler's persistent cache: one SQLite file of measurements.

Keys: an *environment* (a dict naming the machine and software: CPU model, torch thread
count, torch version, memory system; stored once, referred to by its hash), then

- kernel timings: (environment, kernel signature, placement) -> seconds;
- pending in-situ samples of kernels not final yet: (environment, signature) -> samples;
- per-position samples of the interpreter's work after each kernel of one graph (freeing
  the tensors that die there): (environment, graph fingerprint) -> samples per kernel;
  and, in the same table, of each kernel's time after a blocking move (key fingerprint
  + ":wake"), kept so that a killed profile resumes;
- what a kernel loses right after a blocking move, per signature (its "cold" excess, and
  its "second" excess as the kernel after that one): (environment, signature) -> seconds,
  so that a graph whose signatures are all known runs no wake iterations;
- move samples: (environment, direction, mode, bytes, repeat) -> seconds;
- values: (environment, name) -> a number (e.g. the measured peak FLOP/s).

Every measurement is committed as soon as it is recorded (autocommit, WAL journal), so a
profiler killed mid-way loses nothing it had finished. Processes sharing the file measure
one at a time (`measuring`: an flock on `<file>.lock`, released by the kernel when its
holder dies): the others wait, then find in the file what it measured and time only what
is still missing. (Measuring side by side would also slow each other's timings: every
number in the file would be a loaded machine's.) The file stores its schema version;
a file that is not a readable cache of this version is moved aside with a warning and a
fresh cache is built in its place: never a crash, never stale data.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator

SCHEMA_VERSION = 1
APP_ID = "autotm-profile-cache"


class CacheWarning(UserWarning):
    """The cache file was unusable (corrupt or another version) and was rebuilt."""


def default_cache_path() -> Path:
    """$AUTOTM_CACHE_DIR/profile.sqlite, else the user's cache dir (platformdirs)."""
    env = os.environ.get("AUTOTM_CACHE_DIR")
    if env:
        return Path(env) / "profile.sqlite"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("autotm")) / "profile.sqlite"


def environment_key(environment: dict) -> str:
    return hashlib.sha256(json.dumps(environment, sort_keys=True).encode()).hexdigest()[:16]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS environments (env TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kernels (
    env TEXT NOT NULL, signature TEXT NOT NULL, placement TEXT NOT NULL,
    seconds REAL NOT NULL, samples INTEGER NOT NULL, measured_at REAL NOT NULL,
    PRIMARY KEY (env, signature, placement));
CREATE TABLE IF NOT EXISTS moves (
    env TEXT NOT NULL, direction TEXT NOT NULL, mode TEXT NOT NULL, nbytes INTEGER NOT NULL,
    rep INTEGER NOT NULL, seconds REAL NOT NULL,
    PRIMARY KEY (env, direction, mode, nbytes, rep));
CREATE TABLE IF NOT EXISTS pending (
    env TEXT NOT NULL, signature TEXT NOT NULL, samples TEXT NOT NULL, iterations INTEGER NOT NULL,
    PRIMARY KEY (env, signature));
CREATE TABLE IF NOT EXISTS positions (
    env TEXT NOT NULL, graph TEXT NOT NULL, samples TEXT NOT NULL, PRIMARY KEY (env, graph));
CREATE TABLE IF NOT EXISTS wakes (
    env TEXT NOT NULL, signature TEXT NOT NULL, cold REAL NOT NULL, second REAL NOT NULL,
    PRIMARY KEY (env, signature));
CREATE TABLE IF NOT EXISTS vals (
    env TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (env, name));
"""


class ProfileCache:
    """An open cache file. `path=None`: the default location; ":memory:" for none on disk."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = default_cache_path() if path is None else path
        self.rebuilt_reason: str | None = None
        self._measuring = 0  # depth of measuring() in this object (the lock is taken once)
        self._db = self._open()

    # ---- opening ----------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if str(self.path) != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
        return db

    def _problem(self, db: sqlite3.Connection) -> str | None:
        """Why the open file is not a usable cache of this version (None: it is)."""
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return None  # new, empty file
        if "meta" not in tables:
            return "it is not an autotm profile cache"
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        if meta.get("app") != APP_ID:
            return "it is not an autotm profile cache"
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            return (f"it has schema version {meta.get('schema_version')}, this autotm uses "
                    f"{SCHEMA_VERSION}")
        ok = db.execute("PRAGMA quick_check").fetchone()
        if not ok or ok[0] != "ok":
            return f"SQLite reports it damaged ({ok[0] if ok else 'no answer'})"
        return None

    def _open(self) -> sqlite3.Connection:
        reason = None
        try:
            db = self._connect()
            reason = self._problem(db)
            if reason is None:
                self._init(db)
                return db
            db.close()
        except sqlite3.DatabaseError as e:
            reason = f"it cannot be read as SQLite ({e})"
            try:
                db.close()
            except Exception:
                pass
        # unusable: move it aside (kept for inspection) and start again
        self.rebuilt_reason = reason
        aside = None
        if str(self.path) != ":memory:":
            p = Path(self.path)
            aside = p.with_name(p.name + f".broken-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(p) + suffix)
                if src.exists():
                    try:
                        os.replace(src, Path(str(aside) + suffix))
                    except OSError:
                        src.unlink(missing_ok=True)
        warnings.warn(f"autotm profile cache {self.path} is unusable: {reason}; "
                      f"rebuilding it{f' (old file moved to {aside})' if aside else ''}",
                      CacheWarning, stacklevel=3)
        db = self._connect()
        self._init(db)
        return db

    def _init(self, db: sqlite3.Connection) -> None:
        if str(self.path) != ":memory:":
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        # one transaction: a process killed half-way (its `meta` table made, not yet filled)
        # would leave a file the next open takes for someone else's and moves aside
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('app', ?)", (APP_ID,))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    # ---- one measuring process at a time ------------------------------------------------
    @contextlib.contextmanager
    def measuring(self, on_wait: Callable[[int | None], None] | None = None) -> Iterator[None]:
        """Hold the file's measuring lock (`<file>.lock`, an exclusive flock) while the
        block runs; when another process holds it, call `on_wait(its pid or None)` and wait
        for it. Re-entrant within this object; nothing to lock for ":memory:". The lock
        dies with its process (kill -9 included), so a killed profile never blocks the next."""
        if str(self.path) == ":memory:" or self._measuring:
            self._measuring += 1
            try:
                yield
            finally:
                self._measuring -= 1
            return
        # O_NOFOLLOW: a symlink planted at the lock's path is refused, not followed
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait(self._lock_holder(fd))
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)  # (who holds it, for the waiters' message)
            self._measuring = 1
            try:
                yield
            finally:
                self._measuring = 0
        finally:
            os.close(fd)  # releases the lock

    @staticmethod
    def _lock_holder(fd: int) -> int | None:
        try:
            return int(os.pread(fd, 32, 0).decode() or "x")
        except (OSError, ValueError):
            return None

    def __enter__(self) -> ProfileCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- environments -----------------------------------------------------------------
    def environment(self, environment: dict) -> str:
        key = environment_key(environment)
        self._db.execute("INSERT OR IGNORE INTO environments VALUES (?, ?)",
                         (key, json.dumps(environment, sort_keys=True)))
        return key

    # ---- kernels ----------------------------------------------------------------------
    def kernel_times(self, env: str) -> dict[tuple[str, str], float]:
        """Every kernel timing of `env`: (signature, placement) -> seconds."""
        return {(s, p): t for s, p, t in
                self._db.execute("SELECT signature, placement, seconds FROM kernels WHERE env=?", (env,))}

    def put_kernel(self, env: str, signature: str, placement: str, seconds: float, samples: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO kernels VALUES (?, ?, ?, ?, ?, ?)",
                         (env, signature, placement, float(seconds), int(samples), time.time()))

    def pending(self, env: str) -> dict[str, tuple[list[float], int]]:
        """In-situ samples of kernels not final yet: signature -> (samples, iterations)."""
        return {s: (json.loads(x), n) for s, x, n in
                self._db.execute("SELECT signature, samples, iterations FROM pending WHERE env=?", (env,))}

    def put_pending(self, rows: list[tuple[str, str, list[float], int]]) -> None:
        """Store (env, signature, samples, iterations) rows in one transaction."""
        with self._transaction():
            for env, sig, samples, n in rows:
                self._db.execute("INSERT OR REPLACE INTO pending VALUES (?, ?, ?, ?)",
                                 (env, sig, json.dumps(samples), int(n)))

    def put_final(self, env: str, signature: str, placement: str, seconds: float, samples: int) -> None:
        """A final kernel timing, replacing its pending samples, in one transaction."""
        with self._transaction():
            self.put_kernel(env, signature, placement, seconds, samples)
            self._db.execute("DELETE FROM pending WHERE env=? AND signature=?", (env, signature))

    def _transaction(self):
        db = self._db

        class _T:
            def __enter__(self_):
                db.execute("BEGIN")

            def __exit__(self_, exc_type, *rest):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return _T()

    def position_samples(self, env: str, graph: str) -> list[list[float]] | None:
        row = self._db.execute("SELECT samples FROM positions WHERE env=? AND graph=?", (env, graph)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_position_samples(self, env: str, graph: str, samples: list[list[float]]) -> None:
        self._db.execute("INSERT OR REPLACE INTO positions VALUES (?, ?, ?)", (env, graph, json.dumps(samples)))

    # kernels timed after a blocking move (profile.WakeReplay): per role, samples per kernel
    def wake_samples(self, env: str, graph: str) -> dict[str, list[list[float]]] | None:
        return self.position_samples(env, graph + ":wake")

    def put_wake_samples(self, env: str, graph: str, samples: dict[str, list[list[float]]]) -> None:
        self.put_position_samples(env, graph + ":wake", samples)

    def wake_excess(self, env: str) -> dict[str, tuple[float, float]]:
        """signature -> (cold, second) seconds a kernel loses after a blocking move."""
        return {s: (c, e) for s, c, e in
                self._db.execute("SELECT signature, cold, second FROM wakes WHERE env=?", (env,))}

    def put_wake_excess(self, env: str, excess: dict[str, tuple[float, float]], *, replace: bool = False) -> None:
        """Store per-signature wake excesses in one transaction; a signature already known
        keeps its value unless `replace` (every graph's kernels then see the same one)."""
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self._transaction():
            for sig, (cold, second) in excess.items():
                self._db.execute(f"{verb} INTO wakes VALUES (?, ?, ?, ?)", (env, sig, float(cold), float(second)))

    def forget(self, env: str) -> None:
        """Drop every measurement of `env`."""
        for table in ("kernels", "pending", "positions", "wakes", "moves", "vals"):
            self._db.execute(f"DELETE FROM {table} WHERE env=?", (env,))

    def forget_kernels(self) -> None:
        """Drop every kernel measurement (timings, pending samples, per-graph samples,
        workspaces) of every environment; keep the machine's (moves, the executor's
        overheads, the pace probe): a cache as a new model meets it on a profiled machine."""
        with self._transaction():
            for table in ("kernels", "pending", "positions", "wakes"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM vals WHERE name LIKE ?", (self._WORKSPACE + "%",))

    # ---- moves ------------------------------------------------------------------------
    def move_samples(self, env: str) -> dict[tuple[str, str, int, int], float]:
        return {(d, m, n, r): s for d, m, n, r, s in
                self._db.execute("SELECT direction, mode, nbytes, rep, seconds FROM moves WHERE env=?", (env,))}

    def put_move(self, env: str, direction: str, mode: str, nbytes: int, rep: int, seconds: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO moves VALUES (?, ?, ?, ?, ?, ?)",
                         (env, direction, mode, int(nbytes), int(rep), float(seconds)))

    # ---- values -----------------------------------------------------------------------
    def value(self, env: str, name: str) -> float | None:
        row = self._db.execute("SELECT value FROM vals WHERE env=? AND name=?", (env, name)).fetchone()
        return None if row is None else float(row[0])

    def put_value(self, env: str, name: str, value: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO vals VALUES (?, ?, ?)", (env, name, float(value)))

    # ---- kernels' workspace (bytes they allocate and free while they run) ---------------
    _WORKSPACE = "workspace:"

    def workspaces(self, env: str) -> dict[str, int]:
        return {name[len(self._WORKSPACE):]: int(v) for name, v in self._db.execute(
            "SELECT name, value FROM vals WHERE env=? AND name LIKE ?", (env, self._WORKSPACE + "%"))}

    def put_workspace(self, env: str, signature: str, nbytes: int) -> None:
        self.put_value(env, self._WORKSPACE + signature, int(nbytes))


def open_cache(cache: ProfileCache | str | os.PathLike | None) -> tuple[ProfileCache, bool]:
    """(the cache, whether the caller opened it and must close it): a ProfileCache as it
    is, a path or None (the default file) opened here."""
    if isinstance(cache, ProfileCache):
        return cache, False
    return ProfileCache(cache), True
