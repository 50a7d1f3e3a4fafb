"""Readers of DCGM's ``dcgmi health -c`` (background health watches) and ``dcgmi diag`` (active
diagnostics), as the text tables ``dcgmi`` prints and as ``-j`` JSON.

``dcgmi health -c`` tables come in two layouts: DCGM 4.x nests ``GPU / -> 0 / -> Errors /
-> Power system`` rows; DCGM 2.x/3.x prints ``GPU ID: 0`` rows with ``<System> system:
Warning - <message>`` continuations. Both give one ``dcgm_health`` evidence per GPU and
system with status ``Warning`` or ``Failure`` and the message.

``dcgmi diag`` tables give one ``dcgm_diag`` evidence per failed or warned test and GPU
(``GPU2: Fail`` rows of DCGM 4.x, ``Fail - GPU: 0, 1`` results of older releases); the JSON
(``DCGM GPU Diagnostic`` in 3.x, ``DCGM Diagnostic`` in 4.x: ``test_categories / tests /
results``) gives the same.
"""

from __future__ import annotations

import codecs
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from gpuplace._util.documents import loads_json
from gpuplace.health.readers._base import (
    Evidence,
    ReadResult,
    count_lines,
    guarded,
    is_table_border,
    read_text,
)

__all__ = ["DcgmiHealthStream", "read_dcgmi_diag", "read_dcgmi_health"]

_STATUSES = {"healthy": "Healthy", "warning": "Warning", "failure": "Failure", "fail": "Failure"}

# The lines of these tables are taken apart with string operations, not regular expressions
# with a lazy group before ``\s+`` (``^->\s*(.+?)\s+system$`` took 34 s on one line of 1,000
# spaces: each split of the run between the three quantifiers is tried), so every line costs
# time linear in its length whatever it holds.


def _cells(line: str) -> list[str] | None:
    r"""The stripped cells of a ``| a | b |`` row (what ``^\s*\|(.*)\|\s*$`` matches), or None."""
    stripped = line.strip()
    if len(stripped) < 2 or stripped[0] != "|" or stripped[-1] != "|":
        return None
    return [c.strip() for c in stripped[1:-1].split("|")]


def _digits(text: str) -> int | None:
    """The number a string of ASCII digits spells (at most 9 of them: an entity id), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def _system_name(text: str, *, arrow: bool) -> str | None:
    r"""``Power`` from ``-> Power system`` (what ``^->\s*(.+?)\s+system$``, case-insensitive,
    matches; the arrow optional unless ``arrow``), or None."""
    if text.startswith("->"):
        text = text[2:].lstrip()
    elif arrow:
        return None
    if len(text) < 8 or text[-6:].lower() != "system" or not text[-7].isspace():
        return None
    name = text[:-7].rstrip()
    return name if name and "\n" not in name else None


def _entity(text: str, *, arrow: bool = True, gpu_prefix: bool = False) -> int | None:
    """The id of an entity row ``-> 0`` (``GPU ID: 0`` and ``GPU 0`` too with ``gpu_prefix``;
    the arrow optional unless ``arrow``), or None."""
    if text.startswith("->"):
        text = text[2:].lstrip()
    elif arrow:
        return None
    if gpu_prefix and text.startswith("GPU"):
        text = text[3:].lstrip()
        if text.startswith("ID:"):
            text = text[3:].lstrip()
    return _digits(text)


@guarded
def read_dcgmi_health(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``dcgmi health -c`` output (text table or ``-j`` JSON)."""
    name, text = read_text(source)
    if text.lstrip().startswith(("{", "[")):
        return _health_json(name, text, strict)
    result = ReadResult(source=name, format="dcgmi-health", lines=count_lines(text))
    known = 0
    gpu: int | None = None
    group = "GPU"  # the entity group of the "-> N" rows: GPU, NvSwitch, ConnectX, CPU ...
    current: dict[str, Any] | None = None  # the open system incident
    records: list[dict[str, Any]] = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            known += 1
            continue
        if is_table_border(line) and "|" not in line.strip()[1:-1]:
            known += 1
            continue
        cells = _cells(line)
        if cells is None:
            if is_table_border(line):
                known += 1
            continue
        known += 1
        left = cells[0]
        right = " | ".join(cells[1:]).strip() if len(cells) > 1 else ""
        new = _entity(left)  # "-> 0"
        old = _digits(left[7:].lstrip()) if left.startswith("GPU ID:") else None  # "GPU ID: 0"
        system = _system_name(left, arrow=True)  # "-> Power system"
        if left and not left.startswith("->") and old is None and not right:
            group = left  # a section row: "GPU", "NvSwitch", "ConnectX", "CPU"
            gpu, current = None, None
            continue
        if new is not None and group != "GPU":
            gpu, current = None, None  # an NvSwitch or ConnectX entity: not a GPU of the state
            continue
        entity = new if new is not None else old
        if entity is not None:
            gpu = entity
            current = None
            status = _STATUSES.get(right.lower())
            if status is None and right:
                result.bad_line(
                    no,
                    f"expected Healthy, Warning or Failure for GPU {gpu}, got {right!r}",
                    strict=strict,
                )
            if status in ("Warning", "Failure"):
                current = {
                    "gpu": gpu,
                    "system": None,
                    "status": status,
                    "message": [],
                    "line": no,
                    "text": line.strip(),
                }
                records.append(current)
            continue
        if system is not None and gpu is not None:
            status = _STATUSES.get(right.split(" ")[0].lower())
            if status is None:
                result.bad_line(
                    no, f"expected a status for {left[2:].strip()!r}, got {right!r}", strict=strict
                )
                continue
            if records and records[-1]["gpu"] == gpu and records[-1]["system"] is None:
                records.pop()  # the GPU row's status is explained by its systems
            current = {
                "gpu": gpu,
                "system": system,
                "status": status,
                "message": [],
                "line": no,
                "text": line.strip(),
            }
            if status != "Healthy":
                records.append(current)
            continue
        if not left and current is not None and right:
            # DCGM 2.x/3.x: "PCIe system: Warning - Detected more than 8 PCIe replays ...".
            # (Linear: the lazy name is followed by a literal, and the runs of whitespace
            # after each " system:" are disjoint.)
            m_legacy = re.match(
                r"^(.+?) system:\s*(Warning|Failure)\s*-\s*(.*)$", right, re.IGNORECASE
            )
            if m_legacy and current.get("system") is None:
                current["system"] = m_legacy.group(1).strip()
                current["status"] = _STATUSES[m_legacy.group(2).lower()]
                current["message"].append(m_legacy.group(3))
            elif m_legacy:
                current = {
                    "gpu": current["gpu"],
                    "system": m_legacy.group(1).strip(),
                    "status": _STATUSES[m_legacy.group(2).lower()],
                    "message": [m_legacy.group(3)],
                    "line": no,
                    "text": line.strip(),
                }
                records.append(current)
            else:
                current["message"].append(right)
    for r in records:
        message = " ".join(r["message"]).strip()
        system = r["system"] or "health"
        result.evidence.append(
            Evidence(
                kind="dcgm_health",
                source=name,
                line=r["line"],
                text=f"GPU {r['gpu']} {system}: {r['status']}"
                + (f" - {message}" if message else ""),
                gpu_index=r["gpu"],
                values={"status": r["status"], "system": system, "message": message},
            )
        )
    result.unknown = result.lines - known
    return result


#: Lines an open ``dcgmi health -c`` table may hold before the stream gives up on it (a real
#: table is a few lines a GPU and an incident; one that never closes would grow the stream's
#: buffer without bound).
MAX_TABLE_LINES = 100_000

#: Characters of one line the stream holds while waiting for its end; a longer line is dropped
#: (and reported) instead of held.
MAX_LINE_CHARS = 1 << 20


class DcgmiHealthStream:
    """Successive ``dcgmi health -c`` tables appended to one file (``while :; do dcgmi health
    -c; sleep 60; done >> dcgm.log``): :meth:`feed` returns the evidence of each table as soon
    as its closing border has arrived, with line numbers in the whole file.

    Linear in what is fed, however it is cut: a chunk is decoded incrementally (a character
    split between two chunks is kept whole), a line that has not ended is held in a buffer
    that is joined once, when it ends, and each line is examined once for the table's head,
    header rule and closing border (the scan resumes where the last call stopped; it used to
    restart from the first line held, so a table fed in small pieces cost its lines squared).

    Bounded in memory however long it runs: a table still open after
    :data:`MAX_TABLE_LINES` lines, and a line longer than :data:`MAX_LINE_CHARS`, are dropped
    and reported as malformed lines (an error in strict mode)."""

    def __init__(self, name: str, *, host: str | None = None, strict: bool = False):
        self.result = ReadResult(source=name, format="dcgmi-health", host=host)
        self.strict = strict
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = io.StringIO()  # the line that has not ended yet
        self._overlong = False  # the line that has not ended is past MAX_LINE_CHARS (dropped)
        self._lines: list[str] = []
        self._first = 1  # line number of self._lines[0]
        self._scan = 0  # the next line of self._lines to examine
        self._head: int | None = None  # "Health Monitor Report" of the open table
        self._rule: int | None = None  # its header rule (+===)

    def feed(self, data: bytes) -> list[Evidence]:
        text = self._decoder.decode(data)
        if "\n" not in text:
            self._hold(text)
            return []
        complete = (self._partial.getvalue() + text).split("\n")
        self._partial = io.StringIO()
        rest = complete.pop()
        lines = self._lines
        for k, line in enumerate(complete):
            if len(line) > MAX_LINE_CHARS or (k == 0 and self._overlong):
                self._drop_line(self._first + len(lines) + k)
                complete[k] = ""
        self._overlong = False
        self._hold(rest)
        lines.extend(complete)
        self.result.lines += len(complete)
        found: list[Evidence] = []
        done = 0  # lines[:done] belong to tables read already
        for i in range(self._scan, len(lines)):
            stripped = lines[i].strip()
            if self._head is None:
                if "Health Monitor Report" in stripped:
                    self._head = i
            elif self._rule is None:
                if stripped.startswith("+="):
                    self._rule = i
            elif stripped.startswith("+-"):
                start = max(self._head - 1, done)  # with the border above the head
                found += self._table(lines, start, i)
                done = i + 1
                self._head = self._rule = None
        if self._head is not None and len(lines) - self._head > MAX_TABLE_LINES:
            self.result.bad_line(
                self._first + self._head,
                f"a table still open after {MAX_TABLE_LINES} lines (no closing border); dropped",
                strict=self.strict,
            )
            self._head = self._rule = None
        if self._head is None:
            # nothing of a table is open: keep only the last line (it may be a table's top border)
            done = max(done, len(lines) - 1)
        if done:
            del lines[:done]
            self._first += done
            if self._head is not None:
                self._head -= done
            if self._rule is not None:
                self._rule -= done
        self._scan = len(lines)
        self.result.evidence.extend(found)
        return found

    def _hold(self, text: str) -> None:
        """Keep ``text``, the start of a line that has not ended, unless the line is too long."""
        if self._overlong:
            return
        if self._partial.tell() + len(text) > MAX_LINE_CHARS:
            self._partial = io.StringIO()
            self._overlong = True
            return
        self._partial.write(text)

    def _drop_line(self, line: int) -> None:
        self.result.bad_line(
            line, f"a line of more than {MAX_LINE_CHARS} characters; dropped", strict=self.strict
        )

    def _table(self, lines: list[str], start: int, stop: int) -> list[Evidence]:
        """The evidence of the table in ``lines[start : stop + 1]``, numbered in the file."""
        stream = io.StringIO("\n".join(lines[start : stop + 1]) + "\n")
        stream.name = self.result.source
        table = read_dcgmi_health(stream, strict=self.strict)
        offset = self._first + start - 1
        return [
            replace(ev, line=None if ev.line is None else ev.line + offset) for ev in table.evidence
        ]


def _health_json(name: str, text: str, strict: bool) -> ReadResult:
    """``dcgmi health -c -j``: the same tree as the table, in dcgmi's JSON layout (``body``
    sections whose nodes hold ``value``, ``overflow`` lines and ``children``; DcgmiOutputBoxer
    in NVIDIA/DCGM ``dcgmi/DcgmiOutput.cpp``). Every node under the ``GPU`` section keyed by a
    GPU id is one GPU; its systems' status words and messages are collected."""
    result = ReadResult(source=name, format="dcgmi-health-json", lines=count_lines(text))
    doc = _load_json(name, text, result, strict)
    if doc is None:
        return result
    for gpu_id, node in _gpu_nodes(doc):
        for system, status, message in _incidents(node):
            result.evidence.append(
                Evidence(
                    kind="dcgm_health",
                    source=name,
                    line=None,
                    text=f"GPU {gpu_id} {system}: {status}" + (f" - {message}" if message else ""),
                    gpu_index=gpu_id,
                    values={"status": status, "system": system, "message": message},
                )
            )
    return result


def _gpu_nodes(doc: Any) -> Iterator[tuple[int, Any]]:
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if str(key).strip().upper() in ("GPU", "GPUS"):
                    inner = value.get("children", value) if isinstance(value, Mapping) else value
                    if isinstance(inner, Mapping):
                        for k, v in inner.items():
                            gpu = _entity(str(k).strip(), arrow=False, gpu_prefix=True)
                            if gpu is not None:
                                yield gpu, v
                        continue
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def _incidents(node: Any) -> Iterator[tuple[str, str, str]]:
    """(system, status, message) of the non-healthy systems in one GPU's subtree."""
    found = False
    stack: list[tuple[str | None, Any]] = [(None, node)]
    while stack:
        system, item = stack.pop()
        if isinstance(item, Mapping):
            status = _status_of(item)
            here = system
            for key, value in item.items():
                name = _system_name(str(key).strip(), arrow=False)
                stack.append((name if name is not None else here, value))
            if status in ("Warning", "Failure") and system is not None:
                found = True
                yield system, status, _messages(item)
        elif isinstance(item, list):
            stack.extend((system, v) for v in item)
    if not found:
        status = _status_of(node) if isinstance(node, Mapping) else None
        if status in ("Warning", "Failure"):
            yield "health", status, _messages(node)


def _status_of(item: Mapping[str, Any]) -> str | None:
    for key in ("value", "status", "health", "overall_health"):
        value = item.get(key)
        if isinstance(value, str):
            status = _STATUSES.get(value.strip().split(" ")[0].lower())
            if status:
                return status
    return None


def _messages(item: Any) -> str:
    words: list[str] = []
    stack = [item]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _STATUSES.get(node.strip().lower()) is None and node.strip():
                words.append(node.strip())
        elif isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return " ".join(words)


def _load_json(name: str, text: str, result: ReadResult, strict: bool) -> Any:
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:  # a JsonLimitError too (a key twice, deep nesting)
        result.bad_line(exc.lineno, f"not valid JSON ({exc.msg})", strict=True)
    return None


_DIAG_RESULT = re.compile(r"^(Pass|Fail|Warn|Skip)\b(?:\s*-\s*(.*))?$", re.IGNORECASE)
_DIAG_GPU = re.compile(r"^GPU\s*(\d+)\s*:\s*(Pass|Fail|Warn|Skip)\b", re.IGNORECASE)


def _category(line: str) -> str | None:
    r"""``Integration`` from a category rule ``+----- Integration -----------+`` (what
    ``^[|+]-+\s+([A-Za-z][A-Za-z ]*?)\s+-+[+|]`` matches, in one pass: that lazy name
    before ``\s+`` backtracked quadratically on a long run of spaces), or None."""
    if len(line) < 2 or line[0] not in "|+" or line[1] != "-":
        return None
    i = 1
    while i < len(line) and line[i] == "-":
        i += 1
    start = i
    while i < len(line) and line[i].isspace():
        i += 1
    if i == start or i == len(line) or not ("A" <= line[i] <= "Z" or "a" <= line[i] <= "z"):
        return None
    start = i
    while i < len(line) and (line[i] == " " or "A" <= line[i] <= "Z" or "a" <= line[i] <= "z"):
        i += 1
    name = line[start:i].rstrip(" ")
    while i < len(line) and line[i].isspace():
        i += 1
    if start + len(name) == i or i == len(line) or line[i] != "-":
        return None  # no whitespace between the name and the dashes, or no dashes
    while i < len(line) and line[i] == "-":
        i += 1
    return name if i < len(line) and line[i] in "+|" else None


def _gpu_list(detail: str) -> list[int] | None:
    r"""The GPUs of a result detail ``GPU: 0, 1`` / ``GPUs 2,3`` (what
    ``^GPU[s]?\s*:?\s*([\d,\s]+)$`` matches: three adjacent runs of whitespace, cubic on a
    long one), or None."""
    if not detail.startswith("GPU"):
        return None
    rest = detail[4:] if detail.startswith("GPUs") else detail[3:]
    rest = rest.lstrip()
    if rest.startswith(":"):
        rest = rest[1:]
    if not rest or not all(c.isdecimal() or c == "," or c.isspace() for c in rest):
        return None
    return [int(g) for g in rest.replace(",", " ").split() if g.isascii() and len(g) <= 9]


@guarded
def read_dcgmi_diag(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``dcgmi diag`` output (text table or ``-j`` JSON)."""
    name, text = read_text(source)
    if text.lstrip().startswith("{"):
        return _diag_json(name, text, strict)
    result = ReadResult(source=name, format="dcgmi-diag", lines=count_lines(text))
    known = 0
    category = ""
    test: dict[str, Any] | None = None
    notes: dict[int, list[str]] = {}  # message lines per evidence (by index), joined at the end
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        found = _category(stripped)
        if found is not None:
            _close(result, name, test)
            category = found.strip()
            test = None
            known += 1
            continue
        if not stripped or is_table_border(stripped) or stripped.startswith("Successfully ran"):
            known += 1
            continue
        cells = _cells(line)
        if cells is None or len(cells) < 2:
            continue
        known += 1
        left, right = cells[0], " | ".join(cells[1:]).strip()
        if left in ("Diagnostic",) or category == "Metadata":
            continue
        if left and not left.lower().startswith("warning"):
            m = _DIAG_RESULT.match(right)
            if m is None:
                result.bad_line(
                    no,
                    f"expected Pass, Fail, Warn or Skip for test {left!r}, got {right!r}",
                    strict=strict,
                )
                test = None
                continue
            _close(result, name, test)
            test = {
                "name": left,
                "status": m.group(1).capitalize(),
                "line": no,
                "text": stripped,
                "gpus": {},
                "first": len(result.evidence),
                "last": None,  # index of the test's latest evidence
                "by_gpu": {},  # index of its latest evidence per GPU
            }
            detail = m.group(2) or ""
            gpus = _gpu_list(detail)
            if test["status"] in ("Fail", "Warn") and gpus:
                for g in gpus:
                    test["gpus"][g] = (test["status"], no, stripped)
            test["category"] = category
            _emit_pending(result, name, test)
            continue
        if test is None:
            continue
        m_gpu = _DIAG_GPU.match(right)
        if m_gpu:
            status = m_gpu.group(2).capitalize()
            if status in ("Fail", "Warn"):
                _diag_evidence(result, name, test, int(m_gpu.group(1)), status, no, stripped, "")
            continue
        # "| Warning: GPU2 | <message> |" and bare message continuations
        m_warn = re.match(r"^Warning:?\s*(?:GPU\s*(\d+))?$", left, re.IGNORECASE)
        if m_warn or not left:
            _attach_message(
                notes, test, right, int(m_warn.group(1)) if m_warn and m_warn.group(1) else None
            )
    _close(result, name, test)
    _apply_notes(result, notes)
    result.unknown = result.lines - known
    return result


def _close(result: ReadResult, name: str, test: dict[str, Any] | None) -> None:
    """A failed or warned test without per-GPU rows is about every GPU of the run."""
    if test is None or test["status"] not in ("Fail", "Warn"):
        return
    if len(result.evidence) == test["first"]:
        _diag_evidence(result, name, test, None, test["status"], test["line"], test["text"], "")


def _emit_pending(result: ReadResult, name: str, test: dict[str, Any]) -> None:
    for gpu, (status, no, text) in test["gpus"].items():
        _diag_evidence(result, name, test, gpu, status, no, text, "")


def _diag_evidence(
    result: ReadResult,
    name: str,
    test: dict[str, Any],
    gpu: int | None,
    status: str,
    no: int,
    text: str,
    message: str,
) -> None:
    if "by_gpu" in test:
        test["last"] = len(result.evidence)
        test["by_gpu"][gpu] = len(result.evidence)
    result.evidence.append(
        Evidence(
            kind="dcgm_diag",
            source=name,
            line=no,
            text=f"dcgmi diag {test['name']}: {status}"
            + (f" on GPU {gpu}" if gpu is not None else " on all GPUs"),
            gpu_index=gpu,
            values={
                "test": test["name"],
                "category": test.get("category", ""),
                "status": status,
                "message": message,
                "all_gpus": gpu is None,
            },
        )
    )


def _attach_message(
    notes: dict[int, list[str]], test: dict[str, Any], message: str, gpu: int | None
) -> None:
    """Note a message line for the test's latest evidence (on ``gpu`` when given). The
    messages are joined once, at the end (:func:`_apply_notes`): rebuilding the evidence per
    line made thousands of warning lines cubic."""
    index = test["last"] if gpu is None else test["by_gpu"].get(gpu)
    if index is not None and message:
        notes.setdefault(index, []).append(message)


def _apply_notes(result: ReadResult, notes: dict[int, list[str]]) -> None:
    for index, parts in notes.items():
        ev = result.evidence[index]
        values = dict(ev.values)
        values["message"] = " ".join([values.get("message", ""), *parts]).strip()
        result.evidence[index] = replace(
            ev, text=ev.text + f" ({values['message']})", values=values
        )


def _diag_json(name: str, text: str, strict: bool) -> ReadResult:
    result = ReadResult(source=name, format="dcgmi-diag-json", lines=count_lines(text))
    doc = _load_json(name, text, result, strict)
    if not isinstance(doc, Mapping):
        if doc is not None:
            result.bad_line(1, "expected a JSON object with 'DCGM Diagnostic'", strict=strict)
        return result
    root = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(root, Mapping):
        result.bad_line(
            1, "expected a 'DCGM Diagnostic' (or 'DCGM GPU Diagnostic') object", strict=strict
        )
        return result
    categories = root.get("test_categories", [])
    if not isinstance(categories, list):
        result.bad_line(1, "test_categories: expected a list", strict=strict)
        return result
    for cat in categories:
        if not isinstance(cat, Mapping):
            continue
        category = str(cat.get("category", ""))
        for test in cat.get("tests", []) or []:
            if not isinstance(test, Mapping):
                continue
            tname = str(test.get("name", "unknown"))
            for res in test.get("results", []) or []:
                if not isinstance(res, Mapping):
                    continue
                status = str(res.get("status", "")).capitalize()
                if status not in ("Fail", "Warn"):
                    continue
                if res.get("entity_group", "GPU") != "GPU":
                    continue
                gpu_raw = res.get("entity_id", res.get("gpu_id", res.get("gpu_ids")))
                gpus = (
                    [int(g) for g in re.findall(r"\d+", str(gpu_raw))]
                    if gpu_raw is not None
                    else [None]
                )
                warnings = res.get("warnings") or []
                message = " ".join(
                    str(w.get("warning", "")) if isinstance(w, Mapping) else str(w)
                    for w in warnings
                ).strip()
                for gpu in gpus:
                    _diag_evidence(
                        result,
                        name,
                        {"name": tname, "category": category},
                        gpu,
                        status,
                        0,
                        "",
                        message,
                    )
    # JSON has no useful line numbers.
    result.evidence = [
        Evidence(
            kind=e.kind,
            source=e.source,
            line=None,
            text=e.text + (f" ({e.values['message']})" if e.values.get("message") else ""),
            gpu_index=e.gpu_index,
            values=e.values,
        )
        for e in result.evidence
    ]
    return result
