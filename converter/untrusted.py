"""Reading bytes the tool does not trust: every byte of a checkpoint, a Hub repo, an output folder from elsewhere
(docs/security.md). Files are read only when they are regular files (a FIFO or a device is refused, never waited on),
at most a bounded number of bytes; JSON is bounded in nesting before it is parsed and checked against a schema after;
sizes are computed in Python's exact integers."""

from __future__ import annotations

import json
import math
import os
import re
import stat

from converter.errors import InputError

MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


class NotRegularFile(ValueError):
    pass


def os_open_regular(path: str | os.PathLike) -> int:
    """os.open for reading that refuses, with NotRegularFile, anything but a regular file (opening a FIFO waits for
    a writer: it is opened non-blocking); OSError as os.open raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path}: not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | os.PathLike, what: str | None = None, error=InputError) -> int:
    """A descriptor of the regular file `path` opened for reading, or `error` saying why not."""
    shown = what or str(path)
    try:
        return os_open_regular(path)
    except NotRegularFile:
        raise error(f"{shown}: not a regular file") from None
    except OSError as e:
        raise error(f"{shown}: cannot read ({e.strerror or e})") from None


def read_bytes(path: str | os.PathLike, limit: int, what: str | None = None, error=InputError) -> bytes:
    """The whole of a regular file of at most `limit` bytes."""
    fd = open_regular(path, what, error)
    try:
        data = os.read(fd, limit + 1)
        while len(data) <= limit and (more := os.read(fd, limit + 1 - len(data))):
            data += more
    except OSError as e:
        raise error(f"{what or path}: cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what or path}: larger than the {limit} bytes such a file may hold")
    return data


def loads_json(data: bytes, what: str, error=InputError):
    """JSON from untrusted bytes, nested at most MAX_JSON_DEPTH deep (Python's parser recurses)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b'""', data)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            raise error(f"{what}: JSON nested more than {MAX_JSON_DEPTH} deep")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise error(f"{what}: not valid JSON ({str(e).splitlines()[0][:120]})") from None


def read_json(path: str | os.PathLike, what: str | None = None, schema=None, error=InputError):
    """A JSON file, bounded in size and nesting, checked against `schema` (see `check`)."""
    shown = what or str(path)
    value = loads_json(read_bytes(path, MAX_JSON_BYTES, shown, error), shown, error)
    if schema is not None:
        check(value, schema, shown, error)
    return value


class Size:
    """In a schema: a whole number of zero or more (a dimension, a count)."""


class Required:
    """A field of an object schema that must be there (the others may be left out)."""

    def __init__(self, schema):
        self.schema = schema


def check(value, schema, where: str, error=InputError, at: str = ""):
    """`value` against `schema`: a type (float takes int too; bool is no number), a tuple of alternatives, `[item]`
    a list of items, `{str: item}` an object of any keys, `{"name": item, ...}` an object whose named fields are as
    given where present, and present where `Required` (others are let be, for outputs of later versions)."""
    if isinstance(schema, tuple):
        if any(check_value(value, alternative) for alternative in schema):
            return
    elif _fits(value, schema):
        if isinstance(schema, list):
            for i, item in enumerate(value):
                check(item, schema[0], where, error, f"{at}[{i}]")
        elif isinstance(schema, dict) and set(schema) == {str}:
            for key, item in value.items():
                check(item, schema[str], where, error, f"{at}.{key}")
        elif isinstance(schema, dict):
            for key, item in schema.items():
                if key in value:
                    check(value[key], item.schema if isinstance(item, Required) else item, where, error, f"{at}.{key}")
                elif isinstance(item, Required):
                    raise error(f"{where}: {f'{at}.{key}'.lstrip('.')} is missing")
        return
    raise error(f"{where}: {at.lstrip('.') or 'the file'} is {kind(value)}, expected {_expected(schema)}")


class _Mismatch(Exception):
    pass


def check_value(value, schema) -> bool:
    """Whether `value` fits `schema` (as `check`, without the error)."""
    try:
        check(value, schema, "", _Mismatch)
    except _Mismatch:
        return False
    return True


def _fits(value, schema) -> bool:
    if schema is None:
        return value is None
    if isinstance(schema, list):
        return isinstance(value, list)
    if isinstance(schema, dict):
        return isinstance(value, dict)
    if schema is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if schema is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if schema is Size:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, schema)


def kind(value) -> str:
    """What a JSON value is, in words."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return "a negative number"
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def _expected(schema) -> str:
    if isinstance(schema, tuple):
        return " or ".join(_expected(s) for s in schema)
    if isinstance(schema, (list, dict)) or schema in (dict, list):
        return "a list" if isinstance(schema, list) or schema is list else "an object"
    names = {str: "a string", bool: "true/false", int: "a whole number", Size: "a whole number >= 0", float: "a number"}
    return {**names, None: "null"}[schema]


def nbytes(shape, itemsize: int) -> int:
    """Bytes of an array, exactly (numpy's product wraps around past 2**63)."""
    return math.prod(shape) * itemsize


def ascii_digits(text: str) -> bool:
    """'0'-'9' only: str.isdigit is true of '²' and other digits int() may not take."""
    return text.isascii() and text.isdigit()


def plain_file_name(name: str) -> bool:
    """A name for a file inside a folder: no separators, not '.' or '..', nothing absolute."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name
