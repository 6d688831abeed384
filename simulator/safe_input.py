"""Reading untrusted input files safely: the file itself (:func:`read_text`) and the YAML
document in it (:class:`GuardedComposer`, which :mod:`simulator.yamlio` plugs into ruamel.yaml).

A file path given by a user may name a FIFO, ``/dev/zero``, a directory, a symbolic link
loop or a file of gigabytes; a YAML document may be an alias bomb, nested thousands of levels
deep, recursive, keyed by lists, or hold ``.inf`` and 400-digit integers. Each is refused
with one :class:`~simulator.errors.ScenarioError` line before it can block, exhaust memory
or overflow the stack; the sizes come from :mod:`simulator.limits`.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from pathlib import Path
from typing import Any

from ruamel.yaml.composer import Composer
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

from simulator import limits
from simulator.errors import ScenarioError

__all__ = ["GuardedComposer", "read_text", "not_a_regular_file"]

_ELOOP = 40  # errno of "too many levels of symbolic links" (Linux)
_YAML_TAG = "tag:yaml.org,2002:"
# the tags plain YAML resolves to; any other (!custom, !!python/object:...) is refused
_STANDARD_TAGS = frozenset(_YAML_TAG + name for name in (
    "str", "int", "float", "bool", "null", "seq", "map", "timestamp", "merge", "binary", "omap", "set", "value"))


class GuardedComposer(Composer):
    """ruamel's composer with the limits of :mod:`simulator.limits` enforced while the document
    is composed (before any Python object is built): alias references, nesting depth and the
    number of values once aliases are expanded (an alias bomb is refused at its first line
    over the limit), plus what a dtsim file never needs and a hostile one uses: an alias to a
    node that contains it, a list or mapping as a mapping key, a non-finite float and an
    integer literal too long to be a count."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self.warn_double_anchors = False  # legal YAML (the later anchor wins); the warning spans lines on stderr
        self._aliases = 0
        self._size: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded values, expanded depth)
        self._limits = {name: limits.get(name) for name in ("yaml_aliases", "yaml_nodes", "yaml_depth")}
        self._bad_numbers: dict[int, str] = {}  # id(scalar node) -> why; reported with its field once composed

    def _fail(self, message: str, mark: Any) -> None:
        raise ScenarioError(message, line=mark.line + 1 if mark is not None else None)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.parser.check_event(AliasEvent):
            event = self.parser.peek_event()
            self._aliases += 1
            if self._aliases > self._limits["yaml_aliases"]:
                self._fail(str(limits.exceeded("yaml_aliases", self._aliases)), event.start_mark)
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) not in self._size:
                self._fail(f"alias *{event.anchor} refers to a node that contains it (a recursive structure)",
                           event.start_mark)
            return super().compose_node(parent, index)
        if self.depth >= self._limits["yaml_depth"]:
            self._fail(str(limits.exceeded("yaml_depth", self.depth + 1, what="nesting of mappings and lists")),
                       self.parser.peek_event().start_mark)
        node = super().compose_node(parent, index)
        self._measure(node)
        return node

    def _measure(self, node: Any) -> None:
        tag = str(getattr(node.tag, "value", None) or node.tag or "")
        if tag and tag not in _STANDARD_TAGS:
            self._fail(f"YAML tag {tag.replace(_YAML_TAG, '!!')!r} is not supported: write plain values", node.start_mark)
        if isinstance(node, ScalarNode):
            self._check_number(node)
            children: list[Any] = []
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = []
            for key, value in node.value:
                if not isinstance(key, ScalarNode):
                    kind = "mapping" if isinstance(key, MappingNode) else "list"
                    self._fail(f"a mapping key must be a plain name or number, not a {kind}", key.start_mark)
                children += [key, value]
        else:
            children = []
        sizes = [self._size[id(child)] for child in children]
        total = 1 + sum(size for size, _ in sizes)
        depth = 1 + max((d for _, d in sizes), default=0)
        if total > self._limits["yaml_nodes"]:
            self._fail(str(limits.exceeded("yaml_nodes", total)), node.start_mark)
        if depth > self._limits["yaml_depth"]:
            self._fail(str(limits.exceeded("yaml_depth", depth, what="nesting of mappings and lists once aliases "
                                           "are expanded")), node.start_mark)
        self._size[id(node)] = (total, depth)

    def _check_number(self, node: Any) -> None:
        """Note a non-finite float or an over-long integer; :meth:`compose_document` reports the
        first one with its line and field path (the path is known only once the document is)."""
        tag = str(getattr(node.tag, "value", node.tag) or "")
        text = str(node.value)
        if tag.endswith(":float"):
            finite = True
            with contextlib.suppress(ValueError):
                finite = math.isfinite(float(text.replace("_", "")))
            if not finite or text.lower().lstrip("+-") in (".inf", ".nan"):
                self._bad_numbers[id(node)] = f"{text!r} is not a finite number"
        elif tag.endswith(":int") and len(text.lstrip("+-").replace("_", "")) > 30:
            self._bad_numbers[id(node)] = f"integer {text[:20]}... has {len(text)} digits: too large for any field"

    def compose_document(self) -> Any:
        node = super().compose_document()
        if self._bad_numbers:
            found = _first_marked(node, self._bad_numbers)
            if found is not None:
                path, bad = found
                raise ScenarioError(self._bad_numbers[id(bad)], field=path or None, line=bad.start_mark.line + 1)
        return node


def _first_marked(root: Any, marked: dict[int, str]) -> tuple[str, Any] | None:
    """The dotted path (``a.b[1]``) and node of the first node of ``root`` in ``marked``, walked
    iteratively in document order (a document may be nested to the depth limit)."""
    stack: list[tuple[str, Any]] = [("", root)]
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if id(node) in marked:
            return path, node
        if id(node) in seen:  # an alias: the same node again
            continue
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            stack += [(f"{path}[{i}]", child) for i, child in reversed(list(enumerate(node.value)))]
        elif isinstance(node, MappingNode):
            items = []
            for key, value in node.value:
                name = str(key.value)
                items += [(path, key), (f"{path}.{name}" if path else name, value)]
            stack += reversed(items)
    return None


def read_text(path: Path | str, *, expected: str = "a YAML file") -> str:
    """The text of the regular file ``path``, read without ever blocking or reading without end:
    it is opened non-blocking and must be a regular file (not a FIFO, device, socket or
    directory), at most ``file_bytes`` long (:mod:`simulator.limits`), UTF-8 without NUL bytes.
    Anything else raises a one-line :class:`ScenarioError` naming the file."""
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ScenarioError("no such file", file=name) from None
    except IsADirectoryError:
        raise ScenarioError(f"is a directory, expected {expected}", file=name) from None
    except OSError as exc:
        reason = "a symbolic link loop" if exc.errno == _ELOOP else exc.strerror or str(exc)
        raise ScenarioError(f"cannot open file: {reason}", file=name) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ScenarioError(f"is a directory, expected {expected}", file=name)
        if not stat.S_ISREG(info.st_mode):
            mode = info.st_mode
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else (
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise ScenarioError(f"is {kind}, expected {expected} (a regular file)", file=name)
        cap = limits.get("file_bytes")
        if info.st_size > cap:
            raise limits.exceeded("file_bytes", info.st_size, what="file size", file=name)
        chunks, total = [], 0
        while total <= cap:  # a file that grows after fstat is still read at most cap + 1 bytes
            chunk = os.read(fd, min(1 << 20, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise ScenarioError(f"cannot read file: {exc.strerror or exc}", file=name) from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise limits.exceeded("file_bytes", len(data), what="file size", file=name)
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise ScenarioError(f"contains a NUL byte: expected {expected} (text)", file=name, line=line)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(f"is not UTF-8 text (byte {exc.start}): expected {expected}", file=name, line=line) from None


def not_a_regular_file(path: Path | str) -> str | None:
    """Why ``path`` cannot be read as an input file ("no such file", "is a FIFO", ...), or None
    when it is a regular file (checked with ``os.stat``: nothing is opened)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return "a symbolic link loop" if exc.errno == _ELOOP else exc.strerror or str(exc)
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a FIFO"
    return "is a device or socket, not a regular file"

