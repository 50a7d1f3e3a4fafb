"""Reader of NVIDIA driver (NVRM) lines in kernel logs: ``dmesg``, ``dmesg -T``, ``/dev/kmsg``
records, syslog / ``journalctl -k`` lines (which name their host) and ``dmesg --time-format
iso``.

Recognised:

- ``NVRM: Xid (PCI:0000:1b:00): 79, pid=..., name=..., GPU has fallen off the bus.`` in every
  driver generation's shape: with or without the ``PCI:`` prefix, with ``pid='<unknown>'``,
  without pid/name (older drivers), with a non-zero PCI domain (GB200) and a function suffix;
- the multi-line ``NVRM: The NVIDIA GPU 0000:b3:00.0 / (PCI ID: ...) installed in this system
  has / fallen off the bus`` report that newer drivers print without an Xid number (read as
  Xid 79);
- ``NVRM: GPU at PCI:0000:00:05: GPU-<uuid>`` (no evidence, but not an unknown line).

Every other line is counted as unknown. A line with ``NVRM: Xid`` that cannot be read is
malformed: an error naming file and line in strict mode, counted otherwise.

The file is streamed in large chunks and searched as bytes (a fleet's kernel logs run to
gigabytes); memory stays at a few chunk sizes whatever the file size.
"""

from __future__ import annotations

import os
import re
from typing import IO, Any

from gpuplace.errors import InvalidState
from gpuplace.health.readers._base import Evidence, ReadResult, guarded, normalize_pci
from gpuplace.io._common import display_name

__all__ = ["KernelLogScanner", "read_kernel_log"]

#: Bytes read per step: large enough that the per-chunk Python work is negligible next to the
#: byte scans, small enough that memory stays flat.
CHUNK_BYTES = 8 << 20

_HIT = re.compile(rb"NVRM: (?:Xid|The NVIDIA GPU |GPU at PCI:)")
_XID = re.compile(
    rb"NVRM: Xid \(((?:PCI:)?[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\):"
    rb" *(\d{1,5})\b,? *(.*)$"
)
_LOST = re.compile(
    rb"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)"
)
_GPU_AT = re.compile(rb"NVRM: GPU at PCI:")
# syslog / journalctl short (``Feb 14 05:03:41 host kernel:``, optionally with microseconds)
# and ISO (``2026-09-14T20:30:27-0400 host kernel:``) prefixes name the host.
_SYSLOG = re.compile(
    rb"^\s*(?:<\d+>)?(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
    rb"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    rb" (\S+) kernel: "
)
#: How far after ``The NVIDIA GPU`` the ``fallen off the bus`` continuation may be (2 lines).
_LOST_LOOKAHEAD_LINES = 2
_MAX_TEXT = 240


#: Bytes of one line the scanner holds while waiting for its end; a longer line is dropped
#: (and reported) instead of held, so a log that never ends a line cannot grow the scanner.
MAX_LINE_BYTES = 1 << 20


class KernelLogScanner:
    """Incremental scanner: :meth:`feed` bytes as they arrive (a whole file chunk by chunk, or
    a growing log); it returns the evidence found in the complete lines so far. Chunks without
    a line end are kept aside and joined once (linear however the log is cut), and a line over
    :data:`MAX_LINE_BYTES` is dropped and reported as a malformed line."""

    def __init__(self, name: str, *, host: str | None = None, strict: bool = False):
        self.result = ReadResult(source=name, format="kernel-log", host=host)
        self.strict = strict
        self._carry = b""
        self._pending: list[bytes] = []  # chunks of a line that has not ended, after the carry
        self._held = 0  # their bytes
        self._skipping = False  # inside a line over MAX_LINE_BYTES, dropped to its end
        self._line = 1  # number of the first line in the carry
        self._known = 0  # lines that were evidence or known NVRM messages

    def feed(self, data: bytes, *, final: bool = False) -> list[Evidence]:
        if self._skipping:
            cut = data.find(b"\n")
            if cut < 0 and not final:
                return []
            self._skipping = False
            data = data[cut:] if cut >= 0 else b""  # the dropped line stays, as an empty line
        if not final and b"\n" not in data:
            self._pending.append(bytes(data))
            self._held += len(data)
            if self._held > MAX_LINE_BYTES:
                self.result.bad_line(
                    self._line + self._carry.count(b"\n"),
                    f"a line of more than {MAX_LINE_BYTES} bytes; dropped",
                    strict=self.strict,
                )
                self._carry = self._carry[: self._carry.rfind(b"\n") + 1]
                self._pending.clear()
                self._held = 0
                self._skipping = True
            return []
        buffer = b"".join((self._carry, *self._pending, data))
        self._pending.clear()
        self._held = 0
        end = len(buffer) if final else buffer.rfind(b"\n") + 1
        stop, found = self.consume(buffer, end, final=final)
        self._carry = buffer[stop:]
        return found

    def consume(
        self, buffer: bytes | bytearray, end: int, *, final: bool = False
    ) -> tuple[int, list[Evidence]]:
        """Scan ``buffer[:end]`` (complete lines unless ``final``) in place, without copying it;
        returns where the scan stopped (the caller keeps ``buffer[stop:]`` for the next call)
        and the evidence found."""
        found: list[Evidence] = []
        stop = self._scan(buffer, end, found, final)
        lines = buffer.count(b"\n", 0, stop)
        if final and stop and buffer[stop - 1] != 10:
            lines += 1
        self.result.lines += lines
        self._line += lines
        self.result.evidence.extend(found)
        return stop, found

    def finish(self) -> ReadResult:
        self.feed(b"", final=True)
        self.result.unknown = self.result.lines - self._known
        return self.result

    def _scan(
        self, work: bytes | bytearray, stop_at: int, found: list[Evidence], final: bool
    ) -> int:
        """Scan the complete lines of ``work[:stop_at]``; returns where the scan stopped (a
        multi-line report cut by the chunk end is left for the next call)."""
        consumed = 0  # end of the last line taken by a record
        line_at, line_no = 0, self._line
        for m in _HIT.finditer(work, 0, stop_at):
            start = work.rfind(b"\n", 0, m.start()) + 1
            if start < consumed:
                continue
            line_no += work.count(b"\n", line_at, start)
            line_at = start
            end = work.find(b"\n", m.start(), stop_at)
            end = stop_at if end < 0 else end
            line = bytes(work[start:end])
            kind = m.group(0)
            if kind.startswith(b"NVRM: Xid"):
                self._xid(line, line_no, found)
                consumed = end
                self._known += 1
            elif kind.startswith(b"NVRM: GPU at"):
                consumed = end
                self._known += 1
            else:
                taken = self._lost(work, stop_at, start, end, line, line_no, found, final)
                if taken is None:
                    return start  # the continuation lines have not arrived yet
                consumed = taken
        return stop_at

    def _xid(self, line: bytes, line_no: int, found: list[Evidence]) -> None:
        m = _XID.search(line)
        text = _text(line)
        if m is None:
            self.result.bad_line(
                line_no,
                f"expected 'NVRM: Xid (PCI:dddd:bb:dd): <number>, ...', got {text!r}",
                strict=self.strict,
            )
            return
        pci = normalize_pci(m.group(1).decode("ascii"))
        code = int(m.group(2))
        detail = m.group(3).decode("utf-8", "replace").strip()
        found.append(
            Evidence(
                kind="xid",
                source=self.result.source,
                line=line_no,
                text=text,
                host=_host(line),
                gpu_pci=pci,
                values={"xid": code, "detail": detail},
            )
        )

    def _lost(
        self,
        work: bytes | bytearray,
        stop_at: int,
        start: int,
        end: int,
        line: bytes,
        line_no: int,
        found: list[Evidence],
        final: bool,
    ) -> int | None:
        """``The NVIDIA GPU <pci>`` followed within two lines by ``fallen off the bus``: the
        driver's report of a lost GPU without an Xid. Returns the end of the lines taken."""
        m = _LOST.search(line)
        stop, extra = end, 0
        while extra < _LOST_LOOKAHEAD_LINES and stop + 1 < stop_at:
            nxt = work.find(b"\n", stop + 1, stop_at)
            stop = stop_at if nxt < 0 else nxt
            extra += 1
        block = bytes(work[start:stop])
        if m is None:
            return end
        if b"fallen off the bus" not in block:
            if extra < _LOST_LOOKAHEAD_LINES and not final:
                return None  # the continuation lines have not arrived yet
            return end  # another NVRM message about a GPU: not evidence, not an error
        lines_taken = block.count(b"\n") + 1
        self._known += lines_taken
        pci = normalize_pci(m.group(1).decode("ascii"))
        found.append(
            Evidence(
                kind="xid",
                source=self.result.source,
                line=line_no,
                text=_text(b" ".join(part.strip() for part in block.split(b"\n"))),
                host=_host(line),
                gpu_pci=pci,
                values={
                    "xid": 79,
                    "detail": "GPU has fallen off the bus (reported without an Xid)",
                },
            )
        )
        return stop


def _host(line: bytes) -> str | None:
    m = _SYSLOG.match(line)
    return m.group(1).decode("utf-8", "replace") if m else None


def _text(line: bytes) -> str:
    text = line.decode("utf-8", "replace").strip()
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _scan_file(handle: Any, scanner: KernelLogScanner, name: str, chunk_bytes: int) -> None:
    """Read into one reused buffer and scan it in place: the only copies are the kernel's
    into the buffer and the partial last line moved to its front."""
    buffer = bytearray(max(chunk_bytes, 1))
    filled = 0
    while True:
        if filled == len(buffer):  # one line longer than the buffer: grow it
            buffer.extend(bytes(len(buffer)))
        with memoryview(buffer) as view:
            try:
                n = handle.readinto(view[filled:])
            except (OSError, ValueError) as exc:
                raise InvalidState(f"{name}: cannot read: {exc}") from None
        if not n:
            break
        filled += n
        end = buffer.rfind(b"\n", 0, filled) + 1
        if end == 0:
            continue
        stop, _ = scanner.consume(buffer, end)
        rest = filled - stop
        buffer[:rest] = buffer[stop:filled]
        filled = rest
    scanner.feed(bytes(buffer[:filled]))


@guarded
def read_kernel_log(
    source: str | os.PathLike[str] | IO[bytes] | IO[str],
    *,
    host: str | None = None,
    strict: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
) -> ReadResult:
    """Read NVRM evidence from a kernel log (path or open file), streaming it in chunks.

    ``host`` names the host when the lines do not (dmesg output); journal and syslog lines
    name their own. ``strict`` makes an unreadable ``NVRM: Xid`` line an error."""
    name = display_name(source)
    scanner = KernelLogScanner(name, host=host, strict=strict)
    if isinstance(source, (str, os.PathLike)):
        try:
            handle: IO[bytes] | IO[str] = open(source, "rb")
        except OSError as exc:
            raise InvalidState(f"{name}: cannot read file: {exc.strerror or exc}") from None
        close = True
    elif hasattr(source, "read"):
        handle, close = source, False
    else:
        raise InvalidState(f"expected a path or an open file, got {type(source).__name__}")
    try:
        if hasattr(handle, "readinto"):
            _scan_file(handle, scanner, name, chunk_bytes)
        else:
            while True:
                try:
                    data = handle.read(chunk_bytes)
                except (OSError, ValueError) as exc:
                    raise InvalidState(f"{name}: cannot read: {exc}") from None
                if not data:
                    break
                scanner.feed(data.encode("utf-8") if isinstance(data, str) else data)
    finally:
        if close:
            handle.close()
    return scanner.finish()
