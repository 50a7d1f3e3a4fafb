"""Readers for QAPLIB files (the public quadratic-assignment benchmark).

* ``.dat``: ``n``, then matrix A (n x n), then matrix B (n x n), whitespace-separated integers in
  free form (line breaks carry no meaning). The variant from Taillard's site puts ``n best`` on
  the first line.
* ``.sln``: ``n cost``, then the permutation, 1-based; whitespace and/or commas separate tokens.
  (A permutation of 0..n-1 is read as 0-based: some files, e.g. ``tai40a.sln``, are written so.)

The objective is ``cost(p) = sum_ij A[i][j] * B[p[i]][p[j]]``. Malformed files raise
:class:`gpuplace.errors.InvalidJob` (a ``ValueError``) naming the file, the line and token, and
what was expected.
"""

from __future__ import annotations

import os
import re

import numpy as np

from gpuplace.errors import InvalidJob

__all__ = ["read_qaplib", "read_qaplib_solution"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_DAT_SEP = re.compile(r"\s+")
_SLN_SEP = re.compile(r"[\s,]+")


def _tokens(path: str, sep: re.Pattern) -> list[tuple[str, int]]:
    """All tokens of the file with their 1-based line numbers."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    out: list[tuple[str, int]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for tok in sep.split(line.strip()):
            if tok:
                out.append((tok, lineno))
    return out


def _as_int(path: str, tok: str, lineno: int, what: str) -> int:
    try:
        value = int(tok, 10)
    except ValueError:
        raise InvalidJob(
            f"{path}: line {lineno}: expected an integer ({what}), found {tok!r}"
        ) from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise InvalidJob(f"{path}: line {lineno}: {what} {tok} does not fit in a 64-bit integer")
    return value


def _first_line_count(toks: list[tuple[str, int]]) -> int:
    if not toks:
        return 0
    first = toks[0][1]
    count = 0
    for _, ln in toks:
        if ln != first:
            break
        count += 1
    return count


def read_qaplib(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read a QAPLIB ``.dat`` instance; returns ``(A, B)`` as ``int64`` arrays of shape (n, n)."""
    path = os.fspath(path)
    toks = _tokens(path, _DAT_SEP)
    if not toks:
        raise InvalidJob(f"{path}: empty file; expected the size n, then two n x n matrices")
    tok, ln = toks[0]
    n = _as_int(path, tok, ln, "the size n")
    if n <= 0:
        raise InvalidJob(f"{path}: line {ln}: the size n must be positive, found {n}")
    need = 2 * n * n
    body = toks[1:]
    # Taillard's variant: "n best" alone on the first line, then the matrices.
    if len(body) == need + 1 and _first_line_count(toks) == 2:
        _as_int(path, body[0][0], body[0][1], "the best-known value")
        body = body[1:]
    if len(body) < need:
        last_line = toks[-1][1]
        raise InvalidJob(
            f"{path}: truncated after line {last_line}: expected 2*n*n = {need} matrix entries "
            f"for n = {n}, found {len(body)}"
        )
    if len(body) > need:
        tok, ln = body[need]
        raise InvalidJob(
            f"{path}: line {ln}: unexpected extra token {tok!r}: the two {n} x {n} matrices "
            f"end before it ({len(body) - need} token(s) too many)"
        )
    values = np.empty(need, dtype=np.int64)
    for k, (tok, ln) in enumerate(body):
        which = "A" if k < n * n else "B"
        idx = k % (n * n)
        values[k] = _as_int(path, tok, ln, f"entry {which}[{idx // n}][{idx % n}]")
    a = values[: n * n].reshape(n, n)
    b = values[n * n :].reshape(n, n)
    return a, b


def read_qaplib_solution(path: str | os.PathLike[str]) -> tuple[int, int, np.ndarray]:
    """Read a QAPLIB ``.sln``; returns ``(n, cost, perm)`` with ``perm`` 0-based (int64).

    ``perm[i]`` is the location of facility ``i`` as written in the file (a few QAPLIB files
    store the inverse permutation; that is the file's content, not corrected here).
    """
    path = os.fspath(path)
    toks = _tokens(path, _SLN_SEP)
    if len(toks) < 2:
        raise InvalidJob(f"{path}: truncated: expected 'n cost' then n locations")
    n = _as_int(path, toks[0][0], toks[0][1], "the size n")
    if n <= 0:
        raise InvalidJob(f"{path}: line {toks[0][1]}: the size n must be positive, found {n}")
    cost = _as_int(path, toks[1][0], toks[1][1], "the cost")
    body = toks[2:]
    if len(body) < n:
        raise InvalidJob(
            f"{path}: truncated after line {toks[-1][1]}: expected {n} permutation entries, "
            f"found {len(body)}"
        )
    if len(body) > n:
        tok, ln = body[n]
        raise InvalidJob(
            f"{path}: line {ln}: unexpected extra token {tok!r} after the {n} permutation entries"
        )
    raw = [
        (_as_int(path, tok, ln, f"location of facility {i + 1}"), ln)
        for i, (tok, ln) in enumerate(body)
    ]
    # QAPLIB is 1-based, but a few files (e.g. tai40a.sln) are written 0-based: a permutation
    # of 0..n-1 is accepted as such.
    base = 0 if min(v for v, _ in raw) == 0 and max(v for v, _ in raw) == n - 1 else 1
    perm = np.empty(n, dtype=np.int64)
    seen: dict[int, int] = {}
    for i, (v, ln) in enumerate(raw):
        if not base <= v <= n - 1 + base:
            raise InvalidJob(
                f"{path}: line {ln}: location {v} of facility {i + 1} is outside {base}..{n - 1 + base}"
            )
        if v in seen:
            raise InvalidJob(
                f"{path}: line {ln}: not a permutation: facilities {seen[v] + 1} and {i + 1} "
                f"both go to location {v}"
            )
        seen[v] = i
        perm[i] = v - base
    return n, cost, perm
