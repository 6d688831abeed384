"""YAML 1.2 loading with line numbers, and turning validation errors into one-line messages.

Files are read with ruamel.yaml's round-trip loader, which remembers where every key and
item came from; :func:`line_of` walks a field path through that structure so an error can
name ``file:line: field: message``.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from simulator import limits
from simulator.errors import ScenarioError
from simulator.fields import Frozen
from simulator.safe_input import GuardedComposer, read_text

__all__ = [
    "load_yaml",
    "load_mapping",
    "read_text",
    "parse_yaml_text",
    "to_plain",
    "line_of",
    "error_from_validation",
    "exc_model",
    "dotted",
]


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.version = (1, 2)
    yaml.allow_duplicate_keys = False
    yaml.Composer = GuardedComposer  # the limits of simulator.limits
    return yaml


def load_yaml(path: Path | str) -> Any:
    """Read a YAML 1.2 file keeping line information; bad files raise :class:`ScenarioError`."""
    return parse_yaml_text(read_text(path), file=str(path))


def load_mapping(path: Path | str, what: str) -> CommentedMap:
    """Load a YAML file that must hold a mapping (``what`` names it in the error: "a scenario
    (model, cluster, ...)"); an empty file or another kind of document is a ScenarioError."""
    root = load_yaml(path)
    if root is None:
        raise ScenarioError(f"the file is empty; expected {what}", file=str(path))
    if not isinstance(root, CommentedMap):
        raise ScenarioError(f"expected {what}, a mapping of keys", file=str(path), line=1)
    return root


def parse_yaml_text(text: str, *, file: str | None = None) -> Any:
    """Parse YAML 1.2 text within the limits of :mod:`simulator.limits` (``text`` given directly,
    e.g. a ``--set`` value, is held to ``file_bytes`` too)."""
    if len(text) > limits.get("file_bytes"):
        raise limits.exceeded("file_bytes", len(text), what="YAML text size", file=file)
    if "\0" in text:
        raise ScenarioError("contains a NUL byte: expected YAML text", file=file,
                            line=text.count("\n", 0, text.index("\0")) + 1)
    try:
        data = _yaml().load(text)
    except ScenarioError as exc:
        raise exc.located(file=file) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise ScenarioError(f"YAML syntax error: {problem}", file=file, line=line) from None
    except YAMLError as exc:
        raise ScenarioError(f"YAML syntax error: {' '.join(str(exc).split())}", file=file) from None
    except RecursionError:  # a structure deeper than the interpreter's stack: never reached with yaml_depth
        raise ScenarioError("YAML nesting too deep", file=file) from None
    return data


def to_plain(value: Any) -> Any:
    """Round-trip YAML containers and scalars to plain dicts, lists, str, int, float, bool."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def line_of(root: Any, loc: Sequence[Any]) -> int | None:
    """1-based line of the deepest part of ``loc`` that exists in the round-trip ``root``."""
    node = root
    line: int | None = None
    for key in loc:
        if isinstance(node, CommentedMap) and key in node:
            with contextlib.suppress(KeyError, TypeError, AttributeError):
                line = node.lc.key(key)[0] + 1
            node = node[key]
        elif isinstance(node, CommentedSeq) and isinstance(key, int) and 0 <= key < len(node):
            with contextlib.suppress(KeyError, TypeError, AttributeError):
                line = node.lc.item(key)[0] + 1
            node = node[key]
        else:
            break
    if line is None and isinstance(root, (CommentedMap, CommentedSeq)):
        line = root.lc.line + 1 if root.lc.line is not None else None
    return line


def dotted(loc: Sequence[Any]) -> str:
    parts: list[str] = []
    for key in loc:
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            parts.append(("." if parts else "") + str(key))
    return "".join(parts)


# pydantic's own location entries: ``function-after[_check(), Spec]``, ``literal['auto']``; a
# user's key with a bracket but other characters (``bogus\x1b[31m``) stays in the location
_PYDANTIC_TAG = re.compile(r"^[a-z][a-z0-9_-]*\[.*\]$", re.DOTALL)


def _clean_loc(loc: Sequence[Any]) -> tuple[Any, ...]:
    """Drop pydantic-internal location entries (union branch tags, validator names)."""
    cleaned = []
    for key in loc:
        if isinstance(key, str) and (_PYDANTIC_TAG.match(key) or key in {"str", "int", "float", "bool"}):
            continue
        cleaned.append(key)
    return tuple(cleaned)


def _walk(model: type[BaseModel] | None, loc: Sequence[Any]) -> tuple[tuple[Any, ...], Any]:
    """Follow ``loc`` through ``model``'s fields: the location without the branch tags pydantic
    inserts inside a tagged union (``cluster.fabric.torus.dims`` -> ``cluster.fabric.dims``),
    and the model class owning the last key (None when the walk leaves the models)."""
    cleaned: list[Any] = []
    owner: Any = None
    current: Any = model
    branches: dict[Any, Any] = {}
    for key in loc:
        if isinstance(key, str) and key in branches:
            current, branches = branches[key], {}
            continue
        cleaned.append(key)
        owner = current if isinstance(current, type) and issubclass(current, BaseModel) else None
        info = _field_by_name(owner, key) if owner is not None else None
        current = _model_in_annotation(info.annotation) if info is not None else None
        branches = _tagged_branches(info) if info is not None else {}
    return tuple(cleaned), owner


def _tagged_branches(info: Any) -> dict[Any, Any]:
    """Tag value -> member model of a field holding a union discriminated by a field name."""
    tag = info.discriminator
    if not isinstance(tag, str):
        return {}
    out: dict[Any, Any] = {}
    for member in getattr(info.annotation, "__args__", ()) or ():
        if isinstance(member, type) and issubclass(member, BaseModel) and tag in member.model_fields:
            for value in getattr(member.model_fields[tag].annotation, "__args__", ()) or ():
                out[value] = member
    return out


def _field_by_name(model: type[BaseModel], key: Any) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info
    return None


def _model_in_annotation(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in_annotation(arg)
        if found is not None:
            return found
    return None


def _describe_input(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        return ""
    text = repr(value)
    return f" (got {text})" if len(text) < 60 else ""


def error_from_validation(
    exc: ValidationError,
    *,
    root: Any = None,
    file: str | None = None,
    prefix: tuple[Any, ...] = (),
    model: type[BaseModel] | None = None,
) -> ScenarioError:
    """The first error of a pydantic ValidationError as a located :class:`ScenarioError`; an
    unknown field comes before any other error (a typo such as ``hiden`` also makes ``hidden``
    missing: the typo is the news)."""
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    own_loc, owner = _walk(model or exc_model(exc), _clean_loc(err["loc"]))
    loc = prefix + own_loc
    kind = err["type"]
    message = str(err["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        allowed = ([info.alias or field for field, info in owner.model_fields.items() if not info.exclude]
                   if owner is not None else [])
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else (f"; allowed: {', '.join(allowed)}" if allowed else "")
        foreign = getattr(owner, "foreign_field_hint", None)
        other = foreign(name) if foreign is not None else None
        if other:
            hint = f": {other} (allowed: {', '.join(allowed)})"
        message = f"unknown field {name!r}{hint}"
    elif kind == "missing":
        message = "required field is missing"
    elif kind not in {"value_error", "assertion_error"}:
        message = message[0].lower() + message[1:] if message else message
        message += _describe_input(err.get("input"))
    if len(errors) > 1:
        message += f" (+{len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    line = line_of(root, loc) if root is not None else None
    return ScenarioError(message, field=dotted(loc) or None, file=file, line=line)


def exc_model(exc: ValidationError) -> type[BaseModel] | None:
    """Best effort: the model class a ValidationError was raised for (pydantic keeps its
    title), searched among the subclasses of :class:`~simulator.fields.Frozen`."""
    pending: list[type[BaseModel]] = [Frozen]
    while pending:
        candidate = pending.pop()
        if candidate.__name__ == exc.title:
            return candidate
        pending.extend(candidate.__subclasses__())
    return None
