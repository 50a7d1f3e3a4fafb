"""The service's journal: every change to the live state, durable before it is acknowledged.

SQLite in WAL mode with ``synchronous=FULL``: a change is a row in ``events``; a transaction
that commits is on disk (the WAL is fsynced at every commit), so ``kill -9`` (or a power cut)
loses nothing that was acknowledged, and a half-written transaction is rolled back on the next
open. Why SQLite rather than a hand-written append-only file: its recovery is tested far beyond
anything a project could write (torn pages, partial writes, crash during checkpoint), the file
is inspectable with the ``sqlite3`` shell, and snapshot + truncate is one atomic transaction.

One committer thread writes: callers :meth:`Journal.append` events (numbered in the order the
engine applied them) and :meth:`Journal.wait` for their number; the committer takes everything
queued at once into one transaction (group commit), so one fsync covers every request that
arrived meanwhile. Every ``snapshot_every`` events the engine hands a snapshot of the whole
state (taken at an event number); it is written in the same transaction that deletes the events
it covers, so a restart reads one snapshot and replays the events after it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplace.errors import GpuplaceError

__all__ = ["Journal", "JournalError", "Recovered"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (seq INTEGER PRIMARY KEY, taken_at REAL NOT NULL,
                                      body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, at REAL NOT NULL, body TEXT NOT NULL);
"""
FORMAT = "gpuplace.journal/1"


class JournalError(GpuplaceError):
    """The journal cannot be opened, read or written: the service stops taking changes."""


@dataclass
class Recovered:
    """What a journal held when opened: the last snapshot (or None) and the events after it."""

    snapshot: dict[str, Any] | None
    snapshot_seq: int
    events: list[tuple[int, dict[str, Any]]]


class Journal:
    """The durable log of one service. Thread-safe: any thread may append and wait."""

    def __init__(self, path: str | Path, *, max_batch: int = 512):
        self.path = Path(path)
        self.max_batch = max_batch
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():  # the journal holds who runs where: owner only
                self.path.touch(mode=0o600)
            self._db = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30
            )
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(f"{self.path}: SQLite refused WAL mode (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            # Checkpoints (copying the WAL into the database) run on their own thread and
            # connection, PASSIVE, so a commit never waits behind one.
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
            elif row[0] != FORMAT:
                raise JournalError(f"{self.path}: journal format {row[0]!r}, expected {FORMAT}")
            last = self._db.execute(
                "SELECT max(seq) FROM (SELECT seq FROM events UNION ALL SELECT seq FROM snapshots)"
            ).fetchone()[0]
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: cannot open the journal: {exc}") from None
        self._next = int(last or 0) + 1
        self._committed = self._next - 1
        self._queue: list[tuple[int, str] | tuple[int, Callable[[], dict[str, Any]]]] = []
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        self._closing = False
        #: Set at close: the checkpointer waits on it, not on ``_cond``, so that an append
        #: wakes the committer only (each needless wake-up contends for the GIL).
        self._stop = threading.Event()
        #: Called on the committer thread after each group commit (events, seconds), and
        #: when the journal fails (the exception): the service wakes its waiting requests.
        self.on_commit: Callable[[int, float], None] | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self._thread = threading.Thread(
            target=self._commit_loop, name="gpuplace-journal", daemon=True
        )
        self._thread.start()
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, name="gpuplace-checkpoint", daemon=True
        )
        self._checkpointer.start()

    # ------------------------------------------------------------------ reading
    def recover(self) -> Recovered:
        """The last snapshot and the events after it (call before appending)."""
        try:
            row = self._db.execute(
                "SELECT seq, body FROM snapshots ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            snap_seq = int(row[0]) if row else 0
            snapshot = json.loads(row[1]) if row else None
            events = [
                (int(seq), json.loads(body))
                for seq, body in self._db.execute(
                    "SELECT seq, body FROM events WHERE seq > ? ORDER BY seq", (snap_seq,)
                )
            ]
        except (sqlite3.Error, ValueError) as exc:
            raise JournalError(f"{self.path}: cannot read the journal: {exc}") from None
        return Recovered(snapshot, snap_seq, events)

    @property
    def committed(self) -> int:
        """The number of the last event on disk."""
        return self._committed

    @property
    def last(self) -> int:
        """The number of the last event appended (on disk or queued)."""
        return self._next - 1

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    # ------------------------------------------------------------------ writing
    def append(self, event: dict[str, Any]) -> int:
        """Queue an event; returns its number. Call in the order the changes were applied
        (the engine holds its lock)."""
        body = json.dumps(event, separators=(",", ":"))
        with self._cond:
            self._raise_if_failed()
            seq = self._next
            self._next += 1
            self._queue.append((seq, body))
            self._cond.notify_all()
        return seq

    def snapshot(self, take: Callable[[], dict[str, Any]]) -> int:
        """Queue a snapshot covering every event appended so far; ``take`` builds its body and
        runs on the committer thread (so the caller need not wait for it to serialise)."""
        with self._cond:
            self._raise_if_failed()
            seq = self._next - 1
            self._queue.append((seq, take))
            self._cond.notify_all()
        return seq

    def wait(self, seq: int, timeout: float | None = None) -> None:
        """Block until event ``seq`` is on disk; raises JournalError if the journal failed
        (or after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._committed < seq:
                self._raise_if_failed()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise JournalError(f"event {seq} not on disk within {timeout:g} s")
                self._cond.wait(left)

    def close(self) -> None:
        """Write what is queued, then close."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._stop.set()
        self._thread.join(timeout=60)
        self._checkpointer.join(timeout=60)
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
        except sqlite3.Error:
            pass

    def check(self) -> None:
        """Raise JournalError if the journal failed (before changing anything that it would
        then not record)."""
        with self._cond:
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise JournalError(f"{self.path}: the journal failed: {self._failed}")

    def _checkpoint_loop(self, every: float = 2.0) -> None:
        try:
            db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        except sqlite3.Error:
            return
        try:
            while not self._stop.wait(every):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass  # the next one will try again; commits are unaffected
        finally:
            db.close()

    def _commit_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                batch = self._queue[: self.max_batch]
                del self._queue[: len(batch)]
            start = time.perf_counter()
            try:
                self._write(batch)
            except BaseException as exc:  # the disk failed: nothing more may be acknowledged
                with self._cond:
                    self._failed = exc
                    self._cond.notify_all()
                if self.on_failure is not None:
                    self.on_failure(exc)
                return
            elapsed = time.perf_counter() - start
            with self._cond:
                self._committed = max(self._committed, max(seq for seq, _ in batch))
                self._cond.notify_all()
            if self.on_commit is not None:
                self.on_commit(len(batch), elapsed)

    def _write(self, batch: list[Any]) -> None:
        now = time.time()
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = []
            for seq, item in batch:
                if isinstance(item, str):
                    rows.append((seq, now, item))
                    continue
                if rows:
                    db.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)
                    rows = []
                body = json.dumps(item(), separators=(",", ":"))
                db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?)", (seq, now, body))
                db.execute("DELETE FROM events WHERE seq <= ?", (seq,))
                db.execute("DELETE FROM snapshots WHERE seq < ?", (seq,))
            if rows:
                db.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
