"""JSON files read with errors that name the file and line: a run's or a checkpoint's
config.json, a tokenizer's files, a task's JSONL rows (`tasks.data.load_jsonl`).

The floor of the package's file reading (nothing of grpo_jax imported): `models.hf`,
`text.hf`, `tasks.data` and the runner all read JSON through it.
"""

from __future__ import annotations

import json
import math
import os
import sys

__all__ = ["dumps_finite", "json_nesting", "load_json_file", "parse_json", "reject_non_finite"]


def parse_json(text: str, where: str | os.PathLike):
    """`json.loads(text)` whose every failure is a ValueError starting `<where>:<line>: `:
    a syntax error, or nesting deeper than Python's parser recurses (a RecursionError
    otherwise, with a traceback, for e.g. 100000 opening brackets)."""
    where = os.fspath(where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})"
                         ) from None
    except RecursionError:
        line, message = json_nesting(text)
        raise ValueError(f"{where}:{line}: {message}") from None
    except ValueError as e:  # an integer too long to convert
        raise ValueError(f"{where}: {str(e).splitlines()[0]}") from None


def load_json_file(path: str | os.PathLike):
    """The JSON value of a UTF-8 file (a checkpoint's config.json, a run's config.json, ...);
    ValueError `<path>:<line>: ...` for bytes that are not UTF-8 or JSON (see `parse_json`).
    OSError when the file cannot be read."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{os.fspath(path)}:{line}: not UTF-8 (byte 0x{data[e.start]:02x})"
                         ) from None
    return parse_json(text, path)


def json_nesting(text: str) -> tuple[int, str]:
    """(line, message) for JSON nested too deeply to parse: where it is deepest, and how
    deep (brackets inside strings do not count)."""
    depth = deepest = at = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, index
        elif char in "]}":
            depth -= 1
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return line, (f"JSON nested {deepest} levels deep (deepest at column {column}); "
                  f"expected far fewer (Python's JSON parser stops at about "
                  f"{sys.getrecursionlimit()})")


def reject_non_finite(name: str):
    """json.loads's parse_constant: NaN, Infinity and -Infinity are a ValueError."""
    raise ValueError(f"non-finite number {name} (JSON has no NaN or Infinity)")


def finite(value):
    """`value` with every non-finite float (NaN, inf) as None, containers walked, numpy
    scalars made Python numbers: what strict JSON can hold."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return finite(value.item())
    return value


def dumps_finite(value, **kwargs) -> str:
    """json.dumps of `value` with non-finite numbers written as null (never a bare NaN,
    which strict readers reject)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)

