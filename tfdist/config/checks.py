"""Typed checks of parsed YAML values; each failure is a located ConfigError.

Every check takes the `Source` (for file and line), the key path and the value, and
returns the value (converted where that is lossless) or raises.
"""

import difflib
import math
import numbers
import os

from tfdist import limits
from tfdist.config.errors import clip
from tfdist.config.yaml_source import Source
from tfdist.errors import shown

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping", type(None): "nothing (null)"}


def describe(source, path, value):
    """How a value reads in a message: the type, the value, and YAML's part in it."""
    kind = _TYPE_NAMES.get(type(value), type(value).__name__)
    raw = source.raw.get(tuple(path))
    if isinstance(value, bool) and raw is not None and raw.lower() not in ("true", "false"):
        return (f"{kind} ({raw!r} unquoted is read by YAML as {value}; "
                f"write '{raw}' in quotes for the word)")
    return f"{kind}. Received: {path_name(path)}={shown(value)}"


def path_name(path):
    """The last key with its indices: ('cluster', 'worker', 0) -> 'worker[0]'."""
    path = tuple(path)
    keys = [i for i, part in enumerate(path) if isinstance(part, str)]
    if not keys:
        return "value"
    last = keys[-1]
    return clip(path[last]) + "".join(f"[{i}]" for i in path[last + 1:])


def type_error(source, path, expected, value):
    return source.error(path, f"expected {expected}, got {describe(source, path, value)}")


def mapping(source, path, value, allowed, what=None):
    """A mapping whose keys are all in `allowed`; unknown keys suggest the closest one."""
    if not isinstance(value, dict):
        raise type_error(source, path, f"a mapping{' of ' + what if what else ''}", value)
    for key in value:
        if not isinstance(key, str):
            raise source.error(path, f"keys must be strings. Received: key {shown(key)}")
        if key not in allowed:
            raise unknown_key(source, tuple(path) + (key,), key, allowed)
    return value


def unknown_key(source, path, key, allowed):
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    valid = ", ".join(allowed) if allowed else "none"
    return source.error(path, f"unknown key {shown(key)}; {hint}valid keys are [{valid}]")


def string(source, path, value, choices=None):
    if not isinstance(value, str) or not value:
        raise type_error(source, path, "a non-empty string", value)
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise source.error(path, f"{hint}valid values are [{', '.join(choices)}]. "
                                 f"Received: {path_name(path)}={shown(value)}")
    return value


def path(source, key_path, value):
    """A file system path: a non-empty string with no NUL (which no system call takes) and
    at most `limits.MAX_PATH_BYTES` bytes in UTF-8 (Linux's PATH_MAX). A Python caller's
    `os.PathLike` is taken as its text."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    string(source, key_path, value)
    if "\0" in value:
        raise source.error(key_path, f"a path cannot hold a NUL character. "
                                     f"Received: {path_name(key_path)}={shown(value)}")
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > limits.MAX_PATH_BYTES:
        raise source.error(key_path, f"a path is at most {limits.MAX_PATH_BYTES:,} bytes "
                                     f"(MAX_PATH_BYTES). Received: {size:,} bytes")
    return value


def boolean(source, path, value):
    if not isinstance(value, bool):
        raise type_error(source, path, "true or false", value)
    return value


def integer(source, path, value, minimum=None, maximum=None):
    """An integer in [minimum, maximum], and always a 64-bit one (tfdist's counters are
    ``tf.int64``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise type_error(source, path, "an integer", value)
    value = int(value)  # NumPy's integers, from a Python caller
    _in_range(source, path, value, minimum, maximum)
    if not limits.INT64_MIN <= value <= limits.INT64_MAX:
        raise source.error(path, f"expected a 64-bit integer, between {limits.INT64_MIN} and "
                                 f"{limits.INT64_MAX}. Received: {path_name(path)}={shown(value)}")
    return value


def number(source, path, value, minimum=None, maximum=None, open_minimum=False):
    """A finite number that fits a 64-bit float; with `open_minimum`, strictly greater
    than `minimum`. Returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(source, path, "a finite number", value)
    try:
        as_float = float(value)
    except OverflowError:  # an integer beyond 1.8e308
        as_float = math.inf
    if not math.isfinite(as_float):
        raise type_error(source, path, "a finite number (within +-1.8e308)", value)
    if open_minimum and (value <= minimum or (maximum is not None and value > maximum)):
        bounds = f"> {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise source.error(path, f"expected a value {bounds}. "
                                 f"Received: {path_name(path)}={shown(value)}")
    _in_range(source, path, value, None if open_minimum else minimum, maximum)
    return as_float


def string_list(source, path, value):
    if not isinstance(value, (list, tuple)):
        raise type_error(source, path, "a list of strings", value)
    return tuple(string(source, tuple(path) + (i,), v) for i, v in enumerate(value))


def _in_range(source, path, value, minimum, maximum):
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = (f"between {minimum} and {maximum}" if minimum is not None and maximum is not None
                  else f">= {minimum}" if minimum is not None else f"<= {maximum}")
        raise source.error(path, f"expected a value {bounds}. "
                                 f"Received: {path_name(path)}={shown(value)}")


def check_arguments(call, declared, **values):
    """Python arguments of `call`, each checked by the loader's check `declared[name]`:
    refused exactly when the same value in a config file is. Returns them, converted."""
    source = Source.of_call(call)
    return {name: declared[name](source, (name,), value) for name, value in values.items()}
