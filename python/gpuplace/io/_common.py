"""Shared plumbing of the readers: opening a source with size limits, error messages that name
the file and line, and the small number parsers every tool output needs."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import IO, Any, ParamSpec, TypeAlias, TypeVar

from gpuplace._util.documents import MAX_DOCUMENT_BYTES, MAX_INT_DIGITS, long_number_line
from gpuplace._util.hostlist import HostlistError, expand
from gpuplace.errors import GpuplaceError, InvalidTopology

#: Largest input a reader accepts (the one limit of gpuplace._util.documents).
MAX_INPUT_BYTES = MAX_DOCUMENT_BYTES

#: Largest number of names a hostlist or CPU list may expand to inside a reader. Real clusters
#: stay far below; the bound keeps `dgx[1-1000000000]` from exhausting memory.
MAX_NAMES = 200_000

#: Largest GPU or NIC count of one host we believe (a GB200 NVL72 tray has 4 GPUs, a DGX-2 16).
MAX_DEVICES_PER_HOST = 1024

#: What a reader reads: a path, or an open text or binary file.
Source: TypeAlias = "str | os.PathLike[str] | IO[str] | IO[bytes]"

T = TypeVar("T")
P = ParamSpec("P")


def fail(name: str, line: int | None, message: str) -> InvalidTopology:
    """Build the one error type readers raise, as ``file:line: message``."""
    where = f"{name}:{line}" if line is not None else name
    return InvalidTopology(f"{where}: {message}")


def read_source(source: Source, *, limit: int = MAX_INPUT_BYTES) -> tuple[str, str]:
    """Return ``(display name, text)`` of a path or an open text/binary file.

    The whole input is read at once (capped at ``limit`` bytes) because every format needs
    look-ahead (legends after matrices, CA blocks after switch blocks)."""
    data: str | bytes
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        name = os.path.basename(path) or path
        try:
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
        except OSError as exc:
            raise fail(name, None, f"cannot read file: {exc.strerror or exc}") from None
    elif hasattr(source, "read"):
        name = display_name(source)
        try:
            data = source.read(limit + 1)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise fail(name, None, f"cannot read stream: {exc}") from None
    else:
        raise InvalidTopology(f"expected a path or an open file, got {type(source).__name__}")
    if isinstance(data, str):
        text = data
        if len(text) > limit:
            raise fail(name, None, f"input larger than {limit} characters; refusing it")
    elif isinstance(data, (bytes, bytearray)):
        if len(data) > limit:
            raise fail(name, None, f"input larger than {limit} bytes; refusing it")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            line = bytes(data[: exc.start]).count(b"\n") + 1
            raise fail(name, line, "expected UTF-8 text; found undecodable bytes") from None
    else:
        raise fail(name, None, "the stream returned neither text nor bytes")
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise fail(name, line, "expected text; found a NUL byte (binary file?)")
    long_number = long_number_line(text)
    if long_number is not None:
        raise fail(name, long_number, f"a number of more than {MAX_INT_DIGITS} digits")
    return name, text


def guard(error: type[GpuplaceError]) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A decorator making sure a reader (whose first argument is its source) raises nothing
    but ``error``: the topology readers raise InvalidTopology, the health-evidence readers
    InvalidState.

    The parsers validate as they go; this is the safety net for the cases fuzzing finds that
    they did not foresee. The message says it was unexpected so that such a case is reported
    and given a proper check."""

    def decorate(reader: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(reader)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return reader(*args, **kwargs)
            except error:
                raise
            except (RecursionError, MemoryError) as exc:
                raise error(
                    f"{display_name(_source_of(args, kwargs))}: input too deeply nested or too "
                    f"large ({type(exc).__name__})"
                ) from None
            except Exception as exc:
                raise error(
                    f"{display_name(_source_of(args, kwargs))}: unexpected parse failure "
                    f"({type(exc).__name__}: {exc}); the input is not in the expected format"
                ) from exc

        return wrapper

    return decorate


#: The topology readers' guard: nothing but InvalidTopology leaves them.
guarded = guard(InvalidTopology)


def _source_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    return args[0] if args else kwargs.get("source")


def display_name(source: object) -> str:
    """The name a message gives a source: a path's file name, an open file's name, or
    ``<stream>``."""
    if isinstance(source, (str, os.PathLike)):
        return os.path.basename(os.fspath(source)) or os.fspath(source) or "<input>"
    return os.path.basename(str(getattr(source, "name", "") or "")) or "<stream>"


_CPU_ITEM = re.compile(r"^([0-9]{1,9})(?:-([0-9]{1,9}))?$")


def parse_id_list(text: str, name: str, line: int, what: str) -> list[int]:
    """Parse a Linux CPU/NUMA list such as ``0-47,96-143`` (N/A and empty give [])."""
    text = text.strip()
    if text in ("", "N/A", "n/a", "-"):
        return []
    out: list[int] = []
    for item in text.split(","):
        m = _CPU_ITEM.match(item.strip())
        if not m:
            raise fail(name, line, f"{what}: expected a list like 0-47,96-143, got {clip(text)!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi - lo + 1 + len(out) > MAX_NAMES:
            raise fail(name, line, f"{what}: range {clip(item)!r} is backwards or too large")
        out.extend(range(lo, hi + 1))
    return out


def expand_hostlist(expr: str, name: str, line: int | None, what: str) -> list[str]:
    """Expand a Slurm hostlist with the reader's limits, as InvalidTopology on error."""
    try:
        return expand(expr, limit=MAX_NAMES)
    except HostlistError as exc:
        raise fail(name, line, f"{what}: {exc}") from None


def clip(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
