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

import itertools
import os
import re
from collections.abc import Iterator

import numpy as np

from gpuplace._util.documents import MAX_INT_DIGITS, read_text
from gpuplace.errors import InvalidJob

__all__ = ["read_qaplib", "read_qaplib_solution"]

#: The largest instance read: its two matrices take 2 * n * n * 8 bytes (64 MiB at n = 2048).
MAX_SIZE = 2048
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_DAT_SEP = re.compile(r"\s+")
_SLN_SEP = re.compile(r"[\s,]+")


def _tokens(path: str, sep: re.Pattern) -> Iterator[tuple[str, int]]:
    """The tokens of the file with their 1-based line numbers, one at a time (the file within
    the size limit of every reader, UTF-8): a file of millions of tokens is never held as a
    list of them."""
    text = read_text(path, InvalidJob)
    start, lineno = 0, 1
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        for tok in sep.split(text[start:end].strip()):
            if tok:
                yield tok, lineno
        start, lineno = end + 1, lineno + 1


def _as_int(path: str, tok: str, lineno: int, what: str) -> int:
    if len(tok) > MAX_INT_DIGITS:
        raise InvalidJob(
            f"{path}: line {lineno}: {what} has {len(tok)} characters; expected an integer "
            f"of at most {MAX_INT_DIGITS} digits"
        )
    try:
        value = int(tok, 10)
    except ValueError:
        raise InvalidJob(
            f"{path}: line {lineno}: expected an integer ({what}), found {tok!r}"
        ) from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise InvalidJob(f"{path}: line {lineno}: {what} {tok} does not fit in a 64-bit integer")
    return value


def read_qaplib(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read a QAPLIB ``.dat`` instance; returns ``(A, B)`` as ``int64`` arrays of shape (n, n).
    The size n is at most :data:`MAX_SIZE`; the entries are read into the arrays as they come,
    so a file with too many of them is refused at the first one too many."""
    path = os.fspath(path)
    toks = _tokens(path, _DAT_SEP)
    first = next(toks, None)
    if first is None:
        raise InvalidJob(f"{path}: empty file; expected the size n, then two n x n matrices")
    tok, first_line = first
    n = _as_int(path, tok, first_line, "the size n")
    if n <= 0:
        raise InvalidJob(f"{path}: line {first_line}: the size n must be positive, found {n}")
    if n > MAX_SIZE:
        raise InvalidJob(
            f"{path}: line {first_line}: the size n = {n} is beyond {MAX_SIZE} (QAPLIB's largest "
            "instance has n = 256)"
        )
    need = 2 * n * n
    # Taillard's variant: "n best" alone on the first line, then the matrices: room for one more.
    values = np.empty(need + 1, dtype=np.int64)
    count = on_first_line = 0
    last_line = first_line
    for tok, ln in toks:
        if count > need:
            raise InvalidJob(
                f"{path}: line {ln}: unexpected extra token {tok!r}: the two {n} x {n} matrices "
                "end before it"
            )
        values[count] = _as_int(path, tok, ln, "a matrix entry")
        count += 1
        on_first_line += ln == first_line
        last_line = ln
    if count == need + 1 and on_first_line == 1:
        values = values[1:]  # the best-known value
    elif count == need + 1:
        raise InvalidJob(
            f"{path}: line {last_line}: one token too many: the two {n} x {n} matrices end "
            "before it"
        )
    elif count < need:
        raise InvalidJob(
            f"{path}: truncated after line {last_line}: expected 2*n*n = {need} matrix entries "
            f"for n = {n}, found {count}"
        )
    a = values[: n * n].reshape(n, n)
    b = values[n * n : need].reshape(n, n)
    return a, b


def read_qaplib_solution(path: str | os.PathLike[str]) -> tuple[int, int, np.ndarray]:
    """Read a QAPLIB ``.sln``; returns ``(n, cost, perm)`` with ``perm`` 0-based (int64).

    ``perm[i]`` is the location of facility ``i`` as written in the file (a few QAPLIB files
    store the inverse permutation; that is the file's content, not corrected here).
    """
    path = os.fspath(path)
    toks = list(itertools.islice(_tokens(path, _SLN_SEP), MAX_SIZE + 3))
    if len(toks) < 2:
        raise InvalidJob(f"{path}: truncated: expected 'n cost' then n locations")
    n = _as_int(path, toks[0][0], toks[0][1], "the size n")
    if n <= 0:
        raise InvalidJob(f"{path}: line {toks[0][1]}: the size n must be positive, found {n}")
    if n > MAX_SIZE:
        raise InvalidJob(f"{path}: line {toks[0][1]}: the size n = {n} is beyond {MAX_SIZE}")
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
