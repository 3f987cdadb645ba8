"""Reading a YAML file safely, keeping the line and source text of every key.

PyYAML's safe loader builds plain Python values, but forgets where they came from. To
name the line of a bad key, the node tree is walked once to record, for each key path,
its line and the raw scalar text (to explain YAML 1.1 booleans such as ``off``).
"""

import dataclasses

import yaml

from tfdist.config.errors import ConfigError


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

    def error(self, path, reason):
        """A ConfigError located at `path` (a key path tuple)."""
        return ConfigError(reason, file=self.file, line=self.line_of(path), key=format_path(path))

    def line_of(self, path):
        """The line of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path)


def format_path(path):
    """('cluster', 'worker', 1) -> 'cluster.worker[1]'."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or None


def read_yaml(path):
    """Parses one YAML document with the safe loader.

    Returns:
        (data, source): the plain Python value and its `Source`.

    Raises:
        ConfigError: unreadable file, empty file, YAML syntax error, more than one
            document, a duplicate key, or a tag the safe loader refuses
            (``!!python/object`` is an error, never code).
    """
    file = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the config file ({e.strerror or e})", file=file) from None
    except UnicodeDecodeError:
        raise ConfigError("the config file is not UTF-8 text", file=file) from None
    return parse_yaml(text, file)


def parse_yaml(text, file="<string>"):
    """Like `read_yaml`, from a string."""
    try:
        loader = yaml.SafeLoader(text)  # reads the text: control characters fail here
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
        _record(node, (), source)
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


def _record(node, path, source):
    """Fills `source` with the line and raw text of every node below `node`."""
    source.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.ScalarNode):
        source.raw[path] = node.value
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            _record(child, path + (i,), source)
    elif isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key == "<<":
                continue  # complex keys and merges are left to the type checks
            child = path + (key,)
            if key in seen:
                raise ConfigError(
                    f"duplicate key {key!r} (first given on line {seen[key]})",
                    file=source.file, line=key_node.start_mark.line + 1,
                    key=format_path(child))
            seen[key] = key_node.start_mark.line + 1
            source.lines[child] = key_node.start_mark.line + 1
            _record(value_node, child, source)
