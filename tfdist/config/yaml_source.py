"""Reading a YAML file safely, keeping the line and source text of every key.

PyYAML's safe loader builds plain Python values, but forgets where they came from. To
name the line of a bad key, the node tree is walked once to record, for each key path,
its line and the raw scalar text (to explain YAML 1.1 booleans such as ``off``). The
file is read and parsed within `tfdist.limits` (size, values with aliases
expanded, depth, number length), checked as it is read (`yaml_guard.GuardedLoader`).
"""

import dataclasses
import os
import stat

import yaml

from tfdist import limits
from tfdist.errors import shown
from tfdist.config.errors import ConfigError, format_path
from tfdist.config.yaml_guard import GuardedLoader

_MERGE = "tag:yaml.org,2002:merge"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where each value of a parsed document came from.

    Attributes:
        file: the path read (for messages).
        lines: key path (tuple of str keys and int indices) -> 1-based line.
        raw: key path -> the scalar exactly as written (only for scalars).
    """

    file: str
    lines: dict
    raw: dict

    @classmethod
    def of_call(cls, call):
        """The source of a Python call's arguments: the config loader's checks, applied to
        a public constructor's values, name ``call()`` where a file name would stand."""
        return cls(f"{call}()", {}, {})

    def error(self, path, reason):
        """A ConfigError located at `path` (a key path tuple)."""
        return ConfigError(reason, file=self.file, line=self.line_of(path), key=format_path(path))

    def line_of(self, path):
        """The line of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path)


def read_yaml(path):
    """Parses one YAML file with the safe loader, within `tfdist.limits`.

    Returns:
        (data, source): the plain Python value and its `Source`.

    Raises:
        ConfigError: not a path, not a regular file (a FIFO, a device, a directory),
            unreadable, larger than MAX_FILE_BYTES, not UTF-8, empty, a YAML syntax
            error, more than one document, a duplicate key (also one written another
            way, ``1`` and ``0x1``), beyond a limit on values, depth or number length,
            or a tag the safe loader refuses (``!!python/object`` is an error, never code).
    """
    file = _file_name(path)
    data = _read_bytes(path, file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("the config file is not UTF-8 text", file=file) from None
    return parse_yaml(text.replace("\r\n", "\n").replace("\r", "\n"), file)


def _file_name(path):
    """`path` as text for messages, if it is a path at all."""
    try:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError
        file = os.fsdecode(path)
    except TypeError:  # also a PathLike whose __fspath__ gives no path
        raise ConfigError(f"expected a path to a YAML file. Received: path={shown(path)}") from None
    if "\0" in file:
        raise ConfigError("expected a path to a YAML file; a path cannot contain a NUL "
                          "character", file=file)
    return file


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _read_bytes(path, file):
    """At most MAX_FILE_BYTES of a regular file; never blocks on a FIFO or a device."""
    try:
        _check_regular(os.stat(path).st_mode, file)  # before opening: opening a device acts
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise ConfigError(f"cannot read the config file ({e.strerror or e})", file=file) from None
    try:
        _check_regular(os.fstat(fd).st_mode, file)  # what was opened, if it changed since
        chunks, size = [], 0
        while size <= limits.MAX_FILE_BYTES:
            chunk = os.read(fd, limits.MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(f"cannot read the config file ({e.strerror or e})", file=file) from None
    finally:
        os.close(fd)
    if size > limits.MAX_FILE_BYTES:
        raise _too_large(file)
    return b"".join(chunks)


def _check_regular(mode, file):
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise ConfigError(f"expected a regular file, got {kind}", file=file)


def _too_large(file):
    return ConfigError(f"expected a file of at most {limits.MAX_FILE_BYTES:,} bytes (1 MiB, "
                       "tfdist.limits.MAX_FILE_BYTES); a tfdist config is a few "
                       "hundred bytes. Received: a larger file", file=file)


def parse_yaml(text, file="<string>"):
    """Like `read_yaml`, from a string."""
    if len(text) > limits.MAX_FILE_BYTES:
        raise _too_large(file)
    try:
        loader = GuardedLoader(text, file)  # reads the text: control characters fail here
    except yaml.reader.ReaderError as e:
        raise ConfigError(f"invalid YAML: character #x{e.character:04x} is not allowed "
                          "(special characters are not allowed in YAML)", file=file,
                          line=text[:e.position].count("\n") + 1) from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError("the file is empty; expected a mapping of sections "
                              "such as cluster:, strategy:", file=file)
        source = Source(file, {}, {})
        _record(loader, node, source)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        reason = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError(f"invalid YAML: {reason}", file=file,
                          line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}", file=file) from None
    finally:
        loader.dispose()
    return data, source


def _record(loader, root, source):
    """Fills `source` with the line and raw text of every node below `root`.

    Iterative, and bounded by MAX_VALUES and MAX_DEPTH whatever the node graph (the
    loader has already refused documents beyond them).
    """
    todo, visited = [(root, ())], 0
    while todo:
        node, path = todo.pop()
        visited += 1
        if visited > limits.MAX_VALUES or len(path) > limits.MAX_DEPTH:
            raise source.error(path, f"expected at most {limits.MAX_VALUES:,} values and "
                               f"{limits.MAX_DEPTH} levels with every alias expanded "
                               "(tfdist.limits)")
        source.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            source.raw[path] = node.value
            loader.paths.setdefault(id(node), path)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((child, path + (i,)) for i, child in reversed(list(enumerate(node.value))))
        elif isinstance(node, yaml.MappingNode):
            todo.extend(reversed(_keyed_children(loader, node, path, source)))


def _keyed_children(loader, node, path, source):
    """[(value node, key path)] of a mapping; refuses a key given twice, also when
    written two ways that YAML reads as one value (``1`` and ``0x1``, ``true`` and ``yes``)."""
    children, seen = [], {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
            continue  # complex keys and merges are left to the type checks
        raw, line = key_node.value, key_node.start_mark.line + 1
        child = path + (raw,)
        loader.paths.setdefault(id(key_node), child)
        key = loader.construct_object(key_node)  # memoised for construct_document
        if not _hashable(key):
            continue  # ``!!set`` on a key: the constructor names the unhashable key
        if key in seen:
            raise ConfigError(_duplicate(raw, key, *seen[key]), file=source.file, line=line,
                              key=format_path(child))
        seen[key] = (raw, line)
        source.lines[child] = line
        children.append((value_node, child))
    return children


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _duplicate(raw, key, first_raw, first_line):
    if raw == first_raw:
        return f"duplicate key {shown(raw)} (first given on line {first_line})"
    return (f"duplicate key {shown(raw)}: YAML reads it as {shown(key)}, the same key as "
            f"{shown(first_raw)} on line {first_line}")
