"""PyYAML's safe loader, held to `tfdist.limits` while it reads.

The composer asks the parser for one event at a time; `GuardedLoader` checks each event
as it passes, so a document beyond a limit is refused before anything is built from it:
no expanded alias, no deep recursion in PyYAML's composer, no huge number conversion.
Errors name the file, the line and the key path reached so far.
"""

import yaml

from tfdist import limits
from tfdist.errors import shown
from tfdist.config.errors import ConfigError, clip, format_path

_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_KINDS = {f"tag:yaml.org,2002:{tag}": kind for tag, kind in (
    ("int", "an integer"), ("float", "a number"), ("bool", "a boolean"), ("null", "null"),
    ("timestamp", "a valid date or time"), ("binary", "base64 data"))}


class _Open:
    """A list or mapping whose end event has not come yet."""

    __slots__ = ("anchor", "start", "height", "mapping", "children", "key", "path")

    def __init__(self, event, start, path):
        self.anchor, self.start, self.path = event.anchor, start, path
        self.mapping = isinstance(event, yaml.MappingStartEvent)
        self.height, self.children, self.key = 1, 0, None


class GuardedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that enforces MAX_VALUES, MAX_DEPTH and MAX_NUMBER_CHARS.

    Every alias is charged the expanded size and height of its anchor, so both limits
    hold for the document as Python will see it; an alias inside its own anchor
    (a recursive structure) is refused.
    """

    def __init__(self, text, file):
        super().__init__(text)
        self.file = file
        self.paths = {}  # id(node) -> its key path, for errors while constructing
        self._open = []  # open collections, outermost first
        self._anchors = {}  # anchor -> (size, height) of a finished anchored node
        self._total = 0  # values so far, every alias expanded

    def construct_object(self, node, deep=False):
        """PyYAML's, with a scalar it cannot convert (``2001-02-30``, ``!!int abc``) a
        located ConfigError instead of a bare ValueError, KeyError or IndexError."""
        try:
            return super().construct_object(node, deep=deep)
        except ConfigError:
            raise
        except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError) as e:
            raise self._unconvertible(node, e) from None

    def _unconvertible(self, node, error):
        kind = _KINDS.get(node.tag, f"a value tagged {node.tag}")
        value = node.value if isinstance(node, yaml.ScalarNode) else ""
        said = str(error) if isinstance(error, ValueError) else ""
        detail = f" ({clip(said)})" if said and value not in said else ""  # e.g. day out of range
        implicit = node.style is None and self.resolve(
            yaml.ScalarNode, value, (True, False)) == node.tag
        hint = "; quote it to keep it as text" if implicit else ""
        return ConfigError(f"invalid YAML: expected {kind}{detail}{hint}. Received: "
                           f"{shown(value)}", file=self.file, line=node.start_mark.line + 1,
                           key=format_path(self.paths.get(id(node), ())))

    def get_event(self):
        event = super().get_event()
        if isinstance(event, yaml.DocumentStartEvent):
            self._anchors = {}
        elif isinstance(event, yaml.CollectionEndEvent):
            self._close()
        elif isinstance(event, yaml.NodeEvent):
            self._node(event)
        return event

    def _node(self, event):
        path = self._path_of(event)
        if isinstance(event, yaml.AliasEvent):
            return self._alias(event, path)
        self._count(1, event, path)
        if isinstance(event, yaml.ScalarEvent):
            self._check_number(event, path)
            if event.anchor is not None:
                self._anchors[event.anchor] = (1, 0)
            return
        if len(self._open) + 1 > limits.MAX_DEPTH:
            kind = "mapping" if isinstance(event, yaml.MappingStartEvent) else "list"
            raise self._error(event, path, f"expected at most {limits.MAX_DEPTH} nested lists "
                              "and mappings (tfdist.limits.MAX_DEPTH). Received: a "
                              f"{kind} at level {len(self._open) + 1}")
        self._open.append(_Open(event, self._total - 1, path))

    def _close(self):
        node = self._open.pop()
        if node.anchor is not None:
            self._anchors[node.anchor] = (self._total - node.start, node.height)
        self._grow(node.height)

    def _alias(self, event, path):
        anchor = event.anchor
        if any(node.anchor == anchor for node in self._open):
            raise self._error(event, path, f"alias *{anchor} is inside its own anchor "
                              f"&{anchor}; expected an alias to a finished node (a structure "
                              "that contains itself never ends)")
        if anchor not in self._anchors:
            return  # the composer names the undefined alias
        size, height = self._anchors[anchor]
        if len(self._open) + height > limits.MAX_DEPTH:
            raise self._error(event, path, f"expected at most {limits.MAX_DEPTH} nested lists "
                              "and mappings (tfdist.limits.MAX_DEPTH). Received: alias "
                              f"*{anchor} reaching level {len(self._open) + height}")
        self._count(size, event, path)
        self._grow(height)

    def _count(self, size, event, path):
        self._total += size
        if self._total > limits.MAX_VALUES:
            what = (f"alias *{event.anchor} repeats {size:,} values"
                    if isinstance(event, yaml.AliasEvent) else "a larger document")
            raise self._error(event, path, f"expected at most {limits.MAX_VALUES:,} values "
                              "with every alias expanded (tfdist.limits.MAX_VALUES). "
                              f"Received: {what}")

    def _grow(self, height):
        if self._open:
            parent = self._open[-1]
            parent.height = max(parent.height, height + 1)

    def _check_number(self, event, path):
        if len(event.value) <= limits.MAX_NUMBER_CHARS:
            return
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag in _NUMBER_TAGS:
            raise self._error(event, path, f"expected a number of at most "
                              f"{limits.MAX_NUMBER_CHARS} characters (tfdist.limits."
                              f"MAX_NUMBER_CHARS). Received: a number of {len(event.value):,} "
                              "characters")

    def _path_of(self, event):
        """The key path of the node `event` starts; a key's path ends with the key."""
        if not self._open:
            return ()
        parent = self._open[-1]
        index, parent.children = parent.children, parent.children + 1
        if not parent.mapping:
            return parent.path + (index,)
        if index % 2 == 0:  # a key
            parent.key = event.value if isinstance(event, yaml.ScalarEvent) else None
        return parent.path + ((parent.key,) if parent.key is not None else ())

    def _error(self, event, path, reason):
        return ConfigError(reason, file=self.file, line=event.start_mark.line + 1,
                           key=format_path(path))
