"""The service's journal: every change to the live state, in the kernel (or on disk) before it
is acknowledged.

SQLite in WAL mode: a change is a row in ``events``; a transaction that commits survives the
end of the service's process however it ends (``kill -9``, an OOM kill, a crash), and a
half-written transaction is rolled back on the next open. How far past that a commit goes is
the journal's *durability* (``gpuplace serve --durability``):

- ``process`` (SQLite ``synchronous=NORMAL``): a commit is written to the WAL file, not synced;
  it survives the service's death, since the data is in the kernel's page cache. A power cut
  or an operating-system crash may roll back the transactions committed since the WAL was last
  synced; the checkpointer syncs it every ``checkpoint_every`` seconds (SQLite syncs the WAL
  before each checkpoint), so that is what may be lost. The database is never corrupted
  (https://www.sqlite.org/pragma.html#pragma_synchronous, https://www.sqlite.org/wal.html).
- ``power`` (``synchronous=FULL``): the WAL is synced at every commit: a power cut loses
  nothing that was acknowledged either, at the cost of one ``fsync`` per group commit.

Why SQLite rather than a hand-written append-only file: its recovery is tested far beyond
anything a project could write (torn pages, partial writes, crash during checkpoint), the file
is inspectable with the ``sqlite3`` shell, and snapshot + truncate is one atomic transaction.

One writer at a time (a lock), batches in the order of their events: callers
:meth:`Journal.append` events (numbered in the order the engine applied them) and
:meth:`Journal.wait` for their number; the committer thread takes everything queued at once
into one transaction (group commit), so one write (and one sync) covers every request that
arrived meanwhile; a batch of events alone is one ``INSERT``. With ``process`` durability a
commit is a write into the page cache (tens of microseconds), so the thread that serves
requests may write its own events instead (:meth:`Journal.defer_to`, :meth:`Journal.flush`):
the service's event loop commits once per turn what the requests of that turn appended, and no
commit waits for another thread to be scheduled or to get the interpreter's lock (a fifth less
CPU per request at 1,000 requests/s, and a third more requests/s in a closed loop, than handing
every commit over). With ``power`` the sync takes milliseconds, so the committer thread writes
everything. Every ``snapshot_every`` events the engine hands a snapshot of the whole state
(taken at an event number); a snapshot thread builds and serialises it, off the committer's
path (commits go on meanwhile), then the committer writes it in one transaction that deletes
the events it covers, so a restart reads one snapshot and replays the events after it.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from gpuplace.errors import GpuplaceError

__all__ = ["DURABILITY", "Durability", "Journal", "JournalError", "Recovered", "dumps"]

Durability = Literal["process", "power"]
#: ``--durability``: SQLite's ``synchronous`` setting for each.
DURABILITY: dict[str, str] = {"process": "NORMAL", "power": "FULL"}
_log = logging.getLogger("gpuplace.serve")

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

    def __init__(
        self,
        path: str | Path,
        *,
        max_batch: int = 512,
        durability: Durability = "power",
        checkpoint_every: float = 2.0,
    ):
        self.path = Path(path)
        self.max_batch = max_batch
        if durability not in DURABILITY:
            raise JournalError(
                f"durability {durability!r}: expected one of {', '.join(DURABILITY)}"
            )
        self.durability = durability
        self.checkpoint_every = checkpoint_every
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
            self._db.execute(f"PRAGMA synchronous={DURABILITY[durability]}")
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
        #: Events (seq, JSON text) and built snapshots (seq, _Snapshot) to write, in order.
        self._queue: list[tuple[int, str | _Snapshot]] = []
        #: Snapshots to build (seq, take), in order; None stops the snapshot thread.
        self._snapshots: queue.SimpleQueue[tuple[int, Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        mutex = threading.RLock()
        #: Callers of :meth:`wait` wait on this one: an event committed, or a failure.
        self._cond = threading.Condition(mutex)
        #: The committer waits on this one (same lock): work queued, or closing. Appends
        #: wake the committer only, commits the callers of :meth:`wait` only (each needless
        #: wake-up contends for the interpreter's lock).
        self._work = threading.Condition(mutex)
        self._failed: BaseException | None = None
        self._closing = False
        #: Set at close: the checkpointer waits on it, not on ``_cond``, so that an append
        #: wakes the committer only (each needless wake-up contends for the GIL).
        self._stop = threading.Event()
        #: Held while a batch is taken from the queue and written: batches commit in order.
        self._write_lock = threading.Lock()
        #: The thread whose appends are committed by its own :meth:`flush` (and what to call
        #: on each of its appends), see :meth:`defer_to`.
        self._deferring: int | None = None
        self._on_deferred: Callable[[], bool] | None = None
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
        self._snapshotter = threading.Thread(
            target=self._snapshot_loop, name="gpuplace-snapshot", daemon=True
        )
        self._snapshotter.start()

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

    @property
    def inline(self) -> bool:
        """Whether a commit is cheap enough to make on the thread that serves requests (no
        sync: ``process`` durability)."""
        return self.durability == "process"

    # ------------------------------------------------------------------ writing
    def defer_to(self, thread: int | None, scheduled: Callable[[], bool] | None = None) -> None:
        """Events appended on thread ``thread`` (a ``threading.get_ident()``) may be
        committed by that thread's :meth:`flush` instead of the committer: each such append
        calls ``scheduled``, which returns True once it has seen to it that ``flush`` runs
        soon on that thread (the service's event loop schedules one per turn), or False to
        leave the event to the committer. ``None``: the committer writes everything."""
        with self._cond:
            self._deferring = thread
            self._on_deferred = scheduled if thread is not None else None

    def append(self, event: dict[str, Any]) -> int:
        """Queue an event; returns its number. Call in the order the changes were applied
        (the engine holds its lock)."""
        body = dumps(event)
        with self._cond:
            self._raise_if_failed()
            seq = self._next
            self._next += 1
            self._queue.append((seq, body))
            deferred = self._on_deferred if threading.get_ident() == self._deferring else None
            if deferred is None:
                self._work.notify()
        if deferred is not None and not deferred():
            with self._cond:
                self._work.notify()
        return seq

    def flush(self) -> bool:
        """Commit the events queued, on this thread, unless a commit is under way on another
        (then the committer is woken to write them after that one, and this returns False).
        Snapshots queued are left to the committer."""
        if not self._write_lock.acquire(blocking=False):
            with self._cond:
                self._work.notify()
            return False
        try:
            # Events only: a snapshot queued meanwhile is the committer's to write (a large
            # transaction: the loop would wait for it), after or before these events alike (it
            # covers events up to its number and deletes only those).
            while self._commit_batch(events_only=True) == self.max_batch:
                pass
        finally:
            self._write_lock.release()
        return True

    def snapshot(self, take: Callable[[], Any]) -> int:
        """Queue a snapshot covering every event appended so far (call it holding the lock
        that orders the appends); ``take`` builds its body (a JSON-able value) on the snapshot
        thread, so neither the caller nor the committer waits for it to be built and
        serialised; the committer writes it once it is."""
        with self._cond:
            self._raise_if_failed()
            seq = self._next - 1
        self._snapshots.put((seq, take))
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
        """Build the snapshots asked for, write what is queued, then close."""
        self._snapshots.put(None)
        self._snapshotter.join(timeout=60)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._work.notify_all()
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

    def _snapshot_loop(self) -> None:
        while (item := self._snapshots.get()) is not None:
            seq, take = item
            try:
                body = _Snapshot(dumps(take()))
            except Exception:  # the events stay in the journal: nothing is lost, only slower
                _log.exception("snapshot at event %d not taken", seq)
                continue
            with self._cond:
                if self._failed is not None:
                    return
                self._queue.append((seq, body))
                self._work.notify()

    def _checkpoint_loop(self) -> None:
        """PASSIVE checkpoints (never waiting for the committer, never making it wait); with
        ``process`` durability, each syncs the WAL first: what a power cut may take is what
        was committed since the last one."""
        try:
            db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
            db.execute(f"PRAGMA synchronous={DURABILITY[self.durability]}")
        except sqlite3.Error:
            return
        try:
            while not self._stop.wait(self.checkpoint_every):
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
                    self._work.wait()
                if not self._queue and self._closing:
                    return
            with self._write_lock:
                if self._commit_batch() < 0:
                    return

    def _commit_batch(self, events_only: bool = False) -> int:
        """Write what is queued (up to ``max_batch`` items; ``events_only``: leave the
        snapshots queued) in one transaction; the caller holds the write lock. Returns the
        number of items written, -1 once the journal has failed."""
        with self._cond:
            if self._failed is not None:
                return -1
            if events_only:
                batch: list[tuple[int, str | _Snapshot]] = []
                rest = []
                for item in self._queue:
                    if isinstance(item[1], str) and len(batch) < self.max_batch:
                        batch.append(item)
                    else:
                        rest.append(item)
                self._queue[:] = rest
            else:
                batch = self._queue[: self.max_batch]
                del self._queue[: len(batch)]
        if not batch:
            return 0
        start = time.perf_counter()
        try:
            self._write(batch)
        except BaseException as exc:  # the disk failed: nothing more may be acknowledged
            with self._cond:
                self._failed = exc
                self._cond.notify_all()
                self._work.notify_all()
            if self.on_failure is not None:
                self.on_failure(exc)
            return -1
        elapsed = time.perf_counter() - start
        with self._cond:
            self._committed = max(self._committed, max(seq for seq, _ in batch))
            self._cond.notify_all()
        if self.on_commit is not None:
            self.on_commit(len(batch), elapsed)
        return len(batch)

    def _write(self, batch: list[Any]) -> None:
        now = time.time()
        db = self._db
        if len(batch) <= _ONE_STATEMENT and all(isinstance(item, str) for _, item in batch):
            # Events only: one INSERT, its own transaction (atomic as any SQLite statement).
            # One call into SQLite instead of one per event plus BEGIN and COMMIT: each call
            # gives the interpreter's lock up and takes it back, and the committer thread
            # may wait up to a switch interval for it each time.
            db.execute(
                _insert_events(len(batch)), [x for seq, body in batch for x in (seq, now, body)]
            )
            return
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
                body = item.body
                db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?)", (seq, now, body))
                db.execute("DELETE FROM events WHERE seq <= ?", (seq,))
                db.execute("DELETE FROM snapshots WHERE seq < ?", (seq,))
            if rows:
                db.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


#: Most events written by one INSERT (3 values each: within the 999 variables SQLite allowed
#: a statement before 3.32).
_ONE_STATEMENT = 256


@functools.lru_cache(maxsize=_ONE_STATEMENT)
def _insert_events(rows: int) -> str:
    return "INSERT INTO events VALUES " + ",".join(["(?, ?, ?)"] * rows)


@dataclass
class _Snapshot:
    """A snapshot's body, built and serialised: what the committer writes."""

    body: str


def dumps(value: Any) -> str:
    """Compact JSON text: orjson (numpy values too; about fifty times faster than the standard
    library on a snapshot), or the standard library for what orjson refuses (integers over 64
    bits). The documents the journal holds are checked to have finite numbers only (orjson
    would write NaN as null)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))
