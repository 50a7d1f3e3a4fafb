"""Reading and checking the documents users give gpuplace, with its input limits in one place.

Every message has the form ``<source>: <field path>: <what was expected>, got <what>`` (or
``<source>: line N: ...`` while parsing) so a user can find the line to fix. The error class is
chosen by the caller (InvalidTopology for topology files, InvalidJob for job files).

The limits hold by construction, before any work proportional to a hostile value is done: a file
is read up to :data:`MAX_DOCUMENT_BYTES` and no further; bytes that are not UTF-8 are an error
naming the line; an integer literal has at most :data:`MAX_INT_DIGITS` digits (checked on the
text, so Python's own int-from-string limit is never what stops it); JSON and YAML nest at most
:data:`MAX_DEPTH` deep; YAML aliases may repeat at most :data:`MAX_ALIAS_NODES` nodes in all (a
"billion laughs" file is refused after reading it once); and a message shows at most a short,
bounded rendering of a value (:func:`describe`), never the ``repr`` of the whole.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import math
import os
import re
import reprlib
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpuplace.errors import GpuplaceError

#: Largest file or stream gpuplace reads. The biggest real input (a 40-switch SuperPOD
#: ibnetdiscover dump) is 300 kB; 64 MiB leaves room for fabrics of ~100k ports.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
#: Most digits an integer literal may have: far beyond any count, id or size (2**64 has 20),
#: far below Python's own int-from-string limit (4,300), which is never what stops a reader.
MAX_INT_DIGITS = 1000
#: Deepest nesting of lists and mappings in a JSON or YAML document (real files: under 10).
MAX_DEPTH = 100
#: Most nodes YAML aliases may repeat in one document: a file that reuses an anchor a few
#: thousand times passes, one whose aliases multiply out (billion laughs) is refused.
MAX_ALIAS_NODES = 1_000_000
#: YAML documents are parsed by PyYAML's pure-Python composer (the alias and depth budgets
#: need it), which holds several times the text in nodes: a 54 MB job file ran out of a 256 MB
#: budget under the fuzzer. Real YAML documents are small (a 131,072-GPU preset is 50 kB);
#: larger ones go as JSON.
MAX_YAML_BYTES = 16 * 1024 * 1024
_YAML_HINT = " as YAML (write a document this large as JSON)"
#: Every integer a document gives must fit the core's 64-bit integers.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise self.fail(path, f"expected an integer that fits in 64 bits, got {_short(value)}")
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
    # Counted from the bit length: str() of a huge int is slow, and refused past 4,300 digits.
    if value.bit_length() > 64:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    return str(value)


class _BoundedRepr(reprlib.Repr):
    """reprlib's bounded repr (a few items per level, two levels), with integers shortened
    without ``str()`` of the whole."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 2
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 4
        self.maxstring = 36
        self.maxother = 36

    def repr_int(self, x: int, level: int) -> str:
        return _short(x)


_REPR = _BoundedRepr()


def describe(value: Any) -> str:
    """A short rendering of a user's value for a message (``str 'abc'``, ``list [1, 2,
    ...]``): bounded in length and in work whatever the value (an alias bomb, a 5,000-digit
    number)."""
    if value is None:
        return "nothing (null)"
    text = _REPR.repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


_describe = describe


def decode_utf8(data: bytes, source: object, error: type[GpuplaceError]) -> str:
    """``data`` decoded as UTF-8; undecodable bytes raise ``error`` naming the source and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(
            f"{source}: line {line}: expected UTF-8 text; found undecodable bytes"
        ) from None


def read_bytes(
    path: str | os.PathLike[str],
    error: type[GpuplaceError],
    *,
    limit: int = MAX_DOCUMENT_BYTES,
    hint: str = "",
) -> bytes:
    """The bytes of a user's file, at most ``limit`` of them (a larger file is refused without
    being read further, with ``hint`` after the message); ``error`` names the file when it is
    missing or cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{path}: larger than {limit} bytes; refusing it{hint}")
    return data


def read_text(
    path: str | os.PathLike[str], error: type[GpuplaceError], *, limit: int = MAX_DOCUMENT_BYTES
) -> str:
    """The text of a user's file (UTF-8, at most ``limit`` bytes), raising ``error`` naming the
    file (and the line of an undecodable byte)."""
    return decode_utf8(read_bytes(path, error, limit=limit), path, error)


def source_text(
    source: Any, what: str, error: type[GpuplaceError], *, limit: int = MAX_DOCUMENT_BYTES
) -> tuple[str, str]:
    """``(name, text)`` of a path or an open (text or binary) file holding ``what``, with the
    size limit and UTF-8 check of :func:`read_text`."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source), read_text(source, error, limit=limit)
    name = str(getattr(source, "name", "") or what)
    try:
        data = source.read(limit + 1)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise error(f"{name}: cannot read: {exc}") from None
    if isinstance(data, bytes | bytearray):
        if len(data) > limit:
            raise error(f"{name}: larger than {limit} bytes; refusing it")
        return name, decode_utf8(bytes(data), name, error)
    if not isinstance(data, str):
        raise error(f"{name}: the stream returned neither text nor bytes")
    if len(data) > limit:
        raise error(f"{name}: larger than {limit} characters; refusing it")
    return name, data


#: The start of a run of more than MAX_INT_DIGITS digits; the lookbehind makes the search
#: linear (a match is tried only where a run starts).
_LONG_DIGITS = re.compile(rf"(?<!\d)\d{{{MAX_INT_DIGITS + 1}}}")


def long_number_line(text: str) -> int | None:
    """The line of the first number of more than :data:`MAX_INT_DIGITS` digits in ``text``,
    or None: readers of tool output refuse such a text before any ``int()`` sees it."""
    found = _LONG_DIGITS.search(text)
    return None if found is None else _line_of(text, found.start())


class _TooManyDigits(ValueError):
    pass


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


#: The tokens of JSON that matter to find a key: strings and punctuation (each character
#: starts at most one alternative, so the search is linear).
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


def _duplicate_key_at(text: str) -> int | None:
    """The offset of the first key given twice in one object of ``text`` (JSON that parsed up
    to there), found by a second, linear pass: only when a duplicate was seen."""
    stack: list[set[str] | None] = []
    pending: re.Match[str] | None = None
    for token in _JSON_TOKEN.finditer(text):
        kind = token.group()
        if kind == ":" and pending is not None and stack and stack[-1] is not None:
            key = json.loads(pending.group())
            if key in stack[-1]:
                return pending.start()
            stack[-1].add(key)
        pending = None
        if kind == "{":
            stack.append(set())
        elif kind == "[":
            stack.append(None)
        elif kind in "}]":
            if stack:
                stack.pop()
        elif kind.startswith('"'):
            pending = token
    return None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members as a dict, refusing a key given twice (``json`` keeps the last
    silently, as PyYAML did: a second ``"nodes"`` replaced the first without a word)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return document


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS + 1:
        raise _TooManyDigits(text[:20])
    return int(text)


#: One decoder for every call (``json.loads`` with these arguments builds a new one each time:
#: a tenth of the parse of a service's request body).
_DECODER = json.JSONDecoder(parse_int=_bounded_int, object_pairs_hook=_unique_pairs)


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def depth_of(document: Any) -> int:
    """How deeply lists and mappings nest in ``document`` (counted without recursion; stops
    counting past :data:`MAX_DEPTH`)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    seen: set[int] = set()
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


class JsonLimitError(json.JSONDecodeError):
    """JSON that parses but breaks a limit of this module (a key given twice in one object, a
    number of more than :data:`MAX_INT_DIGITS` digits, nesting deeper than :data:`MAX_DEPTH`).
    A :class:`json.JSONDecodeError`, so a caller that reports bad JSON by line reports these the
    same way; ``line`` is None where no position is known (nesting)."""

    def __init__(self, msg: str, doc: str, pos: int | None):
        super().__init__(msg, doc, 0 if pos is None else pos)
        self.line: int | None = None if pos is None else self.lineno


def loads_json(text: str | bytes) -> Any:
    """``json.loads`` with the limits of this module: integers of more than
    :data:`MAX_INT_DIGITS` digits, nesting deeper than :data:`MAX_DEPTH` and a key given twice
    in one object (``json`` keeps the last silently) are refused. Raises
    :class:`json.JSONDecodeError` for what is not JSON and :class:`JsonLimitError` for a limit;
    bytes that are not UTF-8 are a :class:`json.JSONDecodeError` too."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise json.JSONDecodeError(f"not UTF-8 (byte 0x{text[exc.start]:02x})", "", 0) from None
    if text.startswith("\ufeff"):  # as json.loads says it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        document = _DECODER.decode(text)
    except _DuplicateKey as exc:
        raise JsonLimitError(
            f"the key {describe(exc.key)} is given twice in one object",
            text,
            _duplicate_key_at(text),
        ) from None
    except _TooManyDigits:
        found = _LONG_DIGITS.search(text)
        raise JsonLimitError(
            f"a number of more than {MAX_INT_DIGITS} digits",
            text,
            None if found is None else found.start(),
        ) from None
    except RecursionError:
        raise JsonLimitError("nested too deeply", text, None) from None
    # a document nests deeper than MAX_DEPTH only if it has more brackets than that (counted
    # in C; most documents, a service's request bodies among them, are not walked at all)
    if text.count("[") + text.count("{") > MAX_DEPTH and depth_of(document) > MAX_DEPTH:
        raise JsonLimitError(f"nested too deeply (more than {MAX_DEPTH} levels)", text, None)
    return document


def parse_json(
    text: str,
    source: str | os.PathLike[str],
    error: type[GpuplaceError],
    *,
    what: str = "invalid JSON",
) -> Any:
    """Parse JSON text with :func:`loads_json`, raising ``error`` as ``<source>: line L,
    column C: <what>: <why>`` (``<source>: line L: <what>: <why>`` for a limit)."""
    try:
        return loads_json(text)
    except JsonLimitError as exc:
        where = "" if exc.line is None else f"line {exc.line}: "
        raise error(f"{source}: {where}{what}: {exc.msg}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{source}: line {exc.lineno}, column {exc.colno}: {what}: {exc.msg}") from None


class _LimitError(yaml.composer.ComposerError):
    """A YAML document over one of the limits (deep nesting, aliases, huge integers)."""


if TYPE_CHECKING:

    class _LoaderBase(yaml.SafeLoader):  # the methods the mixin calls
        pass

else:
    _LoaderBase = object


class _Bounded(_LoaderBase):
    """The limits of this module for a PyYAML loader: nesting depth, the number of nodes
    aliases repeat (each node's expanded size is counted once, as it is composed, so the count
    costs no more than reading the file), integer digits, keys given twice, and dates that do
    not exist (an error instead of Python's ValueError). Mixed into a loader ahead of its
    composer (:class:`_BoundedLoader`, :class:`_FastBoundedLoader`)."""

    _depth = 0
    _repeated = 0

    def _start_budget(self) -> None:
        self._depth = 0
        self._repeated = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            self._repeated += self._sizes.get(id(node), 1)
            if self._repeated > MAX_ALIAS_NODES:
                raise _LimitError(
                    None,
                    None,
                    f"aliases repeat more than {MAX_ALIAS_NODES} nodes (an alias bomb?)",
                    mark,
                )
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise _LimitError(None, None, f"nested too deeply (more than {MAX_DEPTH} levels)", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self._sizes.get(id(child), 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(
                self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value
            )
        self._sizes[id(node)] = min(size, MAX_ALIAS_NODES + 1)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A mapping, refusing a key given twice (PyYAML keeps the last silently: a second
        ``stores: {lustre: ...}`` entry or node type replaced the first without a word).
        Keys that ``<<`` merges in may be overridden, as YAML intends."""
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode
                ):
                    continue
                key = self.construct_object(key_node)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # unhashable: the base class reports it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"the key {describe(key)} is given twice",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of more than {MAX_INT_DIGITS} digits", node.start_mark
            )
        try:
            return int(super().construct_yaml_int(node))
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"not an integer ({exc})", node.start_mark
            ) from None

    def construct_yaml_timestamp(self, node: Any, values: Any = None) -> Any:
        try:
            return super().construct_yaml_timestamp(node, values)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"not a valid date or time ({exc})", node.start_mark
            ) from None


class _BoundedLoader(_Bounded, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader with the limits (the fallback where PyYAML was built
    without libyaml)."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start_budget()


#: PyYAML's libyaml binding (``yaml.CParser``), where it was built with it.
try:
    from yaml._yaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML without libyaml
    _CParser = None

if _CParser is not None:

    class _FastBoundedLoader(
        _Bounded,
        yaml.composer.Composer,
        _CParser,
        yaml.constructor.SafeConstructor,
        yaml.resolver.Resolver,
    ):
        """The same limits with libyaml reading, scanning and parsing (C, about ten times the
        pure-Python reader's speed) and PyYAML's Python composer building the nodes from
        libyaml's events: the composer is the pure loader's, so the depth and alias budgets,
        the duplicate-key check and the marks (line, column) in messages are the same. (The
        C composer of ``yaml.CSafeLoader`` cannot be given the budgets.)"""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._start_budget()

    _LOADERS: tuple[type[Any], ...] = (_FastBoundedLoader, _BoundedLoader)
else:  # pragma: no cover - PyYAML without libyaml
    _LOADERS = (_BoundedLoader,)

for _loader in _LOADERS:
    _loader.add_constructor("tag:yaml.org,2002:int", _Bounded.construct_yaml_int)
    _loader.add_constructor("tag:yaml.org,2002:timestamp", _Bounded.construct_yaml_timestamp)


_FLOW_BRACKET = re.compile(r"[\[\]{}]")


def _deep_flow_line(text: str) -> int | None:
    """The line where ``[`` and ``{`` first nest deeper than :data:`MAX_DEPTH`, or None.

    Checked before PyYAML sees the text: its scanner does work proportional to the open
    brackets for every token it reads ahead, so a line of thousands of ``[`` takes seconds
    before the composer's own depth limit is reached. (Brackets inside quoted strings count
    too; more than a hundred unclosed ones in a real file would be a mistake anyway.)"""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    depth = 0
    for bracket in _FLOW_BRACKET.finditer(text):
        if bracket.group() in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return _line_of(text, bracket.start())
        elif depth:
            depth -= 1
    return None


def parse_yaml(text: str, source: str | os.PathLike[str], error: type[GpuplaceError]) -> Any:
    """Parse YAML text safely and within the limits of this module, raising ``error`` with the
    source and line."""
    if len(text) > MAX_YAML_BYTES:
        raise error(
            f"{source}: a YAML document of {len(text)} characters; at most {MAX_YAML_BYTES} "
            "are read as YAML (write a document this large as JSON)"
        )
    deep = _deep_flow_line(text)
    if deep is not None:
        raise error(
            f"{source}: line {deep}: invalid YAML: nested too deeply (more than {MAX_DEPTH} "
            "levels of [ and {)"
        )
    loader: Any = None
    try:
        try:
            loader = _LOADERS[0](text)
        except UnicodeEncodeError:  # a lone surrogate: the pure reader names its line
            loader = _BoundedLoader(text)
        return loader.get_single_data()
    except RecursionError:
        raise error(f"{source}: invalid YAML: nested too deeply") from None
    except yaml.reader.ReaderError as exc:
        line = None
        if isinstance(exc.position, int):
            # libyaml counts bytes of the UTF-8 text, the pure reader characters.
            pure = isinstance(loader, _BoundedLoader)
            line = (
                _line_of(text, exc.position)
                if pure
                else text.encode("utf-8").count(b"\n", 0, exc.position) + 1
            )
        where = f"line {line}: " if line else ""
        raise error(
            f"{source}: {where}invalid YAML: character #x{exc.character:04x} is not allowed"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise error(f"{source}: {where}invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_document(
    text: str, source: str | os.PathLike[str], error: type[GpuplaceError], *, json_: bool
) -> Any:
    """JSON (``json_``) or YAML text, parsed within the limits."""
    return parse_json(text, source, error) if json_ else parse_yaml(text, source, error)


def read_yaml_text(path: str | os.PathLike[str], error: type[GpuplaceError]) -> str:
    """The text of a YAML file, at most :data:`MAX_YAML_BYTES` of it: a larger file is refused
    before it is read further (read whole and decoded, a 60 MB file of non-ASCII text took
    four bytes a character and ran out of the fuzzer's 256 MB before the YAML size check)."""
    data = read_bytes(path, error, limit=MAX_YAML_BYTES, hint=_YAML_HINT)
    return decode_utf8(data, path, error)


def read_yaml(path: str | os.PathLike[str], error: type[GpuplaceError]) -> Any:
    """Read and parse a YAML file within the limits, raising ``error`` with the file and line."""
    return parse_yaml(read_yaml_text(path, error), path, error)


def read_document(path: str | os.PathLike[str], error: type[GpuplaceError]) -> Any:
    """Read a YAML or JSON file (by suffix), raising ``error`` with the file and line."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        return parse_json(read_text(path, error), path, error)
    return read_yaml(path, error)


def text_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` with their ends, one at a time (what ``io.StringIO(text)`` gives a
    csv reader, without its copy of the whole text: four bytes a character for non-ASCII, and
    a 64 MiB input must stay within the readers' memory)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def csv_rows(
    reader: Iterable[Any],
    source: object,
    error: type[GpuplaceError],
    *,
    location: Callable[[int], str] | None = None,
) -> Iterator[tuple[int, Any]]:
    """``(line, row)`` of a ``csv.reader`` or ``csv.DictReader`` (its line numbers; a row
    spanning lines gives its last), with the csv module's own errors (a field over its size
    limit, a bare carriage return inside a field) raised as ``error`` naming the line
    (``location(line)``, default ``<source>: line N``)."""
    lines = getattr(reader, "reader", reader)  # a DictReader updates its own count late
    rows = iter(reader)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as exc:
            line = getattr(lines, "line_num", 0)
            where = location(line) if location else f"{source}: line {line}"
            raise error(f"{where}: not valid CSV: {exc}") from None
        yield getattr(lines, "line_num", 0), row


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

    The data goes to a temporary file in the same directory (``.<name>.<random>.tmp``), is
    flushed and fsynced, then renamed over the target; the directory is fsynced so the rename
    itself is durable. The file gets the mode a plain ``open(path, "w")`` would give it: the
    old file's when it replaces one, else 0666 less the umask (a temporary file alone would be
    0600). The writer holds an advisory lock on its temporary file until the rename, so that
    the temporary files a killed writer left behind can be told from those of a writer still
    at work: after its own rename, a successful write removes the leftovers of the same file
    (:func:`_remove_leftovers`).
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
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
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
        dir_fd = None
    if dir_fd is not None:
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    _remove_leftovers(directory, path.name)


#: A temporary file younger than this may belong to a writer between creating it and locking
#: it; it is left for a later write.
_LEFTOVER_AGE_S = 2.0


def _remove_leftovers(directory: Path, name: str) -> None:
    """Remove the temporary files (``.<name>.*.tmp``) that interrupted writes of ``name`` left
    in ``directory``: those no process holds locked (a writer killed before its rename) and
    older than a moment. Best effort: a file that cannot be examined is left alone."""
    now = time.time()
    for leftover in directory.glob(f".{glob_escape(name)}.*.tmp"):
        try:
            fd = os.open(leftover, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if now - os.fstat(fd).st_mtime < _LEFTOVER_AGE_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a writer is at work on it
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        finally:
            os.close(fd)


def glob_escape(name: str) -> str:
    """``name`` with the characters glob patterns treat specially escaped."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


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
