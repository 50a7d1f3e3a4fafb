"""Slurm hostlist expressions: ``dgx[001-004,010]``, ``switch.2.[1-6]``, ``r[1-2]n[01-02]``.

Expansion follows Slurm's rules: a bracket holds comma-separated numbers and ranges, the width
of a zero-padded lower bound is kept, several bracket groups multiply out, and top-level commas
separate expressions. Compression is the inverse used for ``Placement.hostlist()`` and for
topology.conf output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuplace.errors import GpuplaceError

__all__ = ["MAX_HOSTS", "HostlistError", "compress", "count", "expand"]

#: Upper bound on the number of names one expression may expand to. A real cluster has at most
#: a few hundred thousand hosts; anything larger is a typo or a hostile input.
MAX_HOSTS = 1_000_000


class HostlistError(GpuplaceError, ValueError):
    """A hostlist expression is malformed or expands to too many names."""


def _split_top_level(expr: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at position {i} in hostlist {_clip(expr)!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' at position {i} in hostlist {_clip(expr)!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"unclosed '[' in hostlist {_clip(expr)!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
_BRACKET = re.compile(r"\[([^\]]*)\]")
#: Most digits a host number may have (Slurm's own limit is a 64-bit integer: 20).
MAX_DIGITS = 18


def _bracket_ranges(body: str, expr: str) -> list[tuple[int, int, int]]:
    """The ``(lo, hi, width)`` ranges of one bracket, checked but not expanded."""
    out: list[tuple[int, int, int]] = []
    for item in body.split(","):
        item = item.strip()
        m = _RANGE.match(item)
        if not m:
            raise HostlistError(
                f"bad range {_clip(item)!r} in hostlist {_clip(expr)!r}: expected N or N-M "
                "with digits"
            )
        lo_s, hi_s = m.group(1), m.group(2)
        if len(lo_s) > MAX_DIGITS or (hi_s is not None and len(hi_s) > MAX_DIGITS):
            raise HostlistError(
                f"hostlist {_clip(expr)!r}: a host number has more than {MAX_DIGITS} digits"
            )
        lo = int(lo_s)
        hi = int(hi_s) if hi_s is not None else lo
        if hi < lo:
            raise HostlistError(f"range {item!r} in hostlist {_clip(expr)!r} runs backwards")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.append((lo, hi, width))
    return out


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_one(part: str, expr: str) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """The literal before each bracket and the bracket's ranges; a last pair with no ranges
    holds the tail."""
    pieces: list[tuple[str, list[tuple[int, int, int]]]] = []
    pos = 0
    for m in _BRACKET.finditer(part):
        pieces.append((part[pos : m.start()], _bracket_ranges(m.group(1), expr)))
        pos = m.end()
    tail = part[pos:]
    if "[" in tail or "]" in tail:
        raise HostlistError(f"unbalanced brackets in hostlist {_clip(expr)!r}")
    pieces.append((tail, []))
    return pieces


def _count(pieces: list[tuple[str, list[tuple[int, int, int]]]]) -> int:
    total = 1
    for _, ranges in pieces[:-1]:
        total *= sum(hi - lo + 1 for lo, hi, _ in ranges)
    return total


def count(expr: str) -> int:
    """How many names ``expr`` expands to, counted without expanding it."""
    if not isinstance(expr, str):
        raise HostlistError(f"hostlist must be a string, got {type(expr).__name__}")
    return sum(_count(_parse_one(part, expr)) for part in _split_top_level(expr.strip()))


def expand(expr: str, *, limit: int = MAX_HOSTS) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in order. The names are counted
    first: an expression of more than ``limit`` names is refused before any is made.

    >>> expand("dgx[001-003,010]")
    ['dgx001', 'dgx002', 'dgx003', 'dgx010']
    """
    if not isinstance(expr, str):
        raise HostlistError(f"hostlist must be a string, got {type(expr).__name__}")
    parts = [_parse_one(part, expr) for part in _split_top_level(expr.strip())]
    total = sum(_count(pieces) for pieces in parts)
    if total > limit:
        raise HostlistError(
            f"hostlist {_clip(expr)!r} expands to {total} names; at most {limit} are accepted"
        )
    out: list[str] = []
    for pieces in parts:
        names = [""]
        for literal, ranges in pieces[:-1]:
            choices = [str(v).zfill(width) for lo, hi, width in ranges for v in range(lo, hi + 1)]
            names = [n + literal + c for n in names for c in choices]
        tail = pieces[-1][0]
        out.extend(n + tail for n in names)
    return out


_NUM_SUFFIX = re.compile(r"^(.*?)(\d+)$")


def _ranges(numbers: list[tuple[int, str]]) -> str:
    """Render sorted (value, text) pairs of equal width as ``a-b,c``."""
    pieces, i = [], 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1][0] == numbers[j][0] + 1:
            j += 1
        pieces.append(numbers[i][1] if i == j else f"{numbers[i][1]}-{numbers[j][1]}")
        i = j + 1
    return ",".join(pieces)


def compress(names: Iterable[str]) -> str:
    """Compress host names into a Slurm hostlist expression (``dgx[001-004,010]``).

    Names are grouped by their prefix and the digit width of their numeric suffix; groups are
    emitted in order of first appearance, numbers sorted and de-duplicated within a group.
    ``expand(compress(names))`` returns the same set of names.
    """
    parsed: list[tuple[str, str] | str] = []
    padded_widths: dict[str, set[int]] = {}
    for name in names:
        m = _NUM_SUFFIX.match(name)
        if not m or "[" in name or "]" in name or "," in name:
            parsed.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        parsed.append((prefix, digits))
        if digits.startswith("0") and len(digits) > 1:
            padded_widths.setdefault(prefix, set()).add(len(digits))
    groups: dict[tuple[str, int], list[tuple[int, str]]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for item in parsed:
        if isinstance(item, str):
            if item not in plain:
                plain.append(item)
                order.append(item)
            continue
        prefix, digits = item
        # A zero-padded number fixes the width of its group; an unpadded number of that many
        # digits belongs to the same group (dgx099, dgx100 -> dgx[099-100]); other unpadded
        # numbers share width 0, so that 9 and 10 land in one range.
        width = len(digits) if len(digits) in padded_widths.get(prefix, ()) else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((int(digits), digits))
    out = []
    for entry in order:
        if isinstance(entry, str):
            out.append(entry)
            continue
        prefix, _ = entry
        nums = sorted(set(groups[entry]))
        if len(nums) == 1:
            out.append(prefix + nums[0][1])
        else:
            out.append(f"{prefix}[{_ranges(nums)}]")
    return ",".join(out)
