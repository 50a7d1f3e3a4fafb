"""Small helpers that check user-supplied dictionaries and name the offending field.

Every message has the form ``<source>: <field path>: <what was expected>, got <what>`` so a
user can find the line to fix. The error class is chosen by the caller (InvalidTopology for
topology files, InvalidJob for job files).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuplace.errors import GpuplaceError


class Checker:
    """Field checks that raise ``error(<source>: <path>: <message>)``."""

    def __init__(self, error: type[GpuplaceError], source: str | None):
        self.error = error
        self.source = source

    def fail(self, path: str, message: str) -> GpuplaceError:
        where = f"{self.source}: " if self.source else ""
        field = f"{path}: " if path else ""
        return self.error(f"{where}{field}{message}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected a mapping, got {_describe(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(path, f"keys must be strings, got {_describe(key)}")
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise self.fail(path, f"expected a list, got {_describe(value)}")
        return list(value)

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"expected a non-empty string, got {_describe(value)}")
        return value

    def integer(
        self, value: Any, path: str, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.fail(path, f"expected an integer, got {_describe(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"expected an integer >= {minimum}, got {_short(value)}")
        if maximum is not None and value > maximum:
            raise self.fail(path, f"expected an integer <= {maximum}, got {_short(value)}")
        return value

    def number(
        self, value: Any, path: str, *, minimum: float | None = None, positive: bool = False
    ) -> float:
        if isinstance(value, str):
            # YAML 1.1 reads exponent forms without a sign (70.6e9) as strings.
            try:
                value = float(value.replace("_", ""))
            except ValueError:
                raise self.fail(path, f"expected a number, got {_describe(value)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"expected a number, got {_describe(value)}")
        try:
            value = float(value)
        except OverflowError:
            raise self.fail(path, "expected a finite number, got an integer too large") from None
        if not math.isfinite(value):
            raise self.fail(path, f"expected a finite number, got {value}")
        if positive and value <= 0:
            raise self.fail(path, f"expected a number > 0, got {value}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"expected a number >= {minimum}, got {value}")
        return value

    def keys(self, value: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(
                f"{path}.{unknown[0]}" if path else unknown[0],
                f"unknown field; expected one of {', '.join(sorted(allowed))}",
            )


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"a {len(text)}-digit number"


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def read_text(path: str | os.PathLike[str], error: type[GpuplaceError]) -> str:
    """The text of a user's file (UTF-8), raising ``error`` naming the file when it is missing
    or cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None


def parse_json(text: str, source: str | os.PathLike[str], error: type[GpuplaceError]) -> Any:
    """Parse JSON text, raising ``error`` with the source, line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{source}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}"
        ) from None
    except RecursionError:
        raise error(f"{source}: invalid JSON: nested too deeply") from None


def read_document(path: str | os.PathLike[str], error: type[GpuplaceError]) -> Any:
    """Read a YAML or JSON file (by suffix), raising ``error`` with the file and line."""
    path = Path(path)
    text = read_text(path, error)
    if path.suffix.lower() == ".json":
        return parse_json(text, path, error)
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise error(f"{path}: invalid YAML: nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise error(f"{path}: {where}invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: invalid YAML: {exc}") from None


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` sets it, which would race
    with other threads creating files): from ``/proc/self/status`` where there is one."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves either the old or the new file.

    The data goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over the target; the directory is fsynced so the rename itself is durable. The
    file gets the mode a plain ``open(path, "w")`` would give it: the old file's when it
    replaces one, else 0666 less the umask (a temporary file alone would be 0600).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # Crash tests set this to hold the process between the write and the rename.
        pause = os.environ.get("GPUPLACE_TEST_PAUSE_BEFORE_RENAME_S")
        if pause:
            time.sleep(float(pause))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


#: Locks the current thread holds (resolved path -> depth): re-entrant for the thread that
#: holds them (flock on a second descriptor would wait forever). Other threads open their own
#: descriptor and wait, as other processes do.
_HELD = threading.local()


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``<path>.lock`` while reading, changing and writing
    ``path``: two commands updating one state file at once then run one after the other
    instead of one silently losing the other's change. The lock file stays (it is empty).
    Re-entrant within one thread."""
    lock_path = str(Path(f"{path}.lock").resolve())
    held: dict[str, int] = _HELD.__dict__.setdefault("paths", {})
    if held.get(lock_path):
        held[lock_path] += 1
        try:
            yield
        finally:
            held[lock_path] -= 1
        return
    with open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        held[lock_path] = 1
        try:
            yield
        finally:
            held.pop(lock_path, None)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def directory_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on the directory holding ``path`` (flock on the
    directory itself, so no lock file is left beside the file): for a check-then-replace of
    ``path`` that must not interleave with another process's. Re-entrant within one thread."""
    directory = str(Path(path).resolve().parent)
    key = f"dir:{directory}"
    held: dict[str, int] = _HELD.__dict__.setdefault("paths", {})
    if held.get(key):
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[key] = 1
        try:
            yield
        finally:
            held.pop(key, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def dump_document(path: str | Path, document: Any) -> str:
    """Serialize as JSON for ``.json`` paths, YAML otherwise."""
    if Path(path).suffix.lower() == ".json":
        return json.dumps(document, indent=1) + "\n"
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=100)
