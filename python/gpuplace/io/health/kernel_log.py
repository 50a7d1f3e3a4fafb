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
from typing import IO

from gpuplace.errors import InvalidState
from gpuplace.io.health._base import Evidence, ReadResult, display_name, guarded, normalize_pci

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


class KernelLogScanner:
    """Incremental scanner: :meth:`feed` bytes as they arrive (a whole file chunk by chunk, or
    a growing log); it returns the evidence found in the complete lines so far."""

    def __init__(self, name: str, *, host: str | None = None, strict: bool = False):
        self.result = ReadResult(source=name, format="kernel-log", host=host)
        self.strict = strict
        self._carry = b""
        self._line = 1  # number of the first line in the carry
        self._known = 0  # lines that were evidence or known NVRM messages

    def feed(self, data: bytes, *, final: bool = False) -> list[Evidence]:
        buffer = self._carry + data if self._carry else data
        if final:
            work, rest = buffer, b""
        else:
            cut = buffer.rfind(b"\n")
            if cut < 0:
                self._carry = buffer
                return []
            work, rest = buffer[: cut + 1], buffer[cut + 1 :]
        found: list[Evidence] = []
        stop = self._scan(work, found, final)
        done = work[:stop]
        lines = done.count(b"\n")
        if final and done and not done.endswith(b"\n"):
            lines += 1
        self.result.lines += lines
        self._line += lines
        self._carry = work[stop:] + rest
        self.result.evidence.extend(found)
        return found

    def finish(self) -> ReadResult:
        self.feed(b"", final=True)
        self.result.unknown = self.result.lines - self._known
        return self.result

    def _scan(self, work: bytes, found: list[Evidence], final: bool) -> int:
        """Scan complete lines; returns where the scan stopped (a multi-line report cut by the
        chunk end is left for the next call)."""
        consumed = 0  # end of the last line taken by a record
        line_at, line_no = 0, self._line
        for m in _HIT.finditer(work):
            start = work.rfind(b"\n", 0, m.start()) + 1
            if start < consumed:
                continue
            line_no += work.count(b"\n", line_at, start)
            line_at = start
            end = work.find(b"\n", m.start())
            end = len(work) if end < 0 else end
            line = work[start:end]
            kind = m.group(0)
            if kind.startswith(b"NVRM: Xid"):
                self._xid(line, line_no, found)
                consumed = end
                self._known += 1
            elif kind.startswith(b"NVRM: GPU at"):
                consumed = end
                self._known += 1
            else:
                taken = self._lost(work, start, end, line, line_no, found, final)
                if taken is None:
                    return start  # the continuation lines have not arrived yet
                consumed = taken
        return len(work)

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
        work: bytes,
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
        while extra < _LOST_LOOKAHEAD_LINES and stop + 1 < len(work):
            nxt = work.find(b"\n", stop + 1)
            stop = len(work) if nxt < 0 else nxt
            extra += 1
        block = work[start:stop]
        if m is None or b"fallen off the bus" not in block:
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
        while True:
            try:
                data = handle.read(chunk_bytes)
            except (OSError, ValueError) as exc:
                raise InvalidState(f"{name}: cannot read: {exc}") from None
            if not data:
                break
            if isinstance(data, str):
                data = data.encode("utf-8")
            scanner.feed(data)
    finally:
        if close:
            handle.close()
    return scanner.finish()
