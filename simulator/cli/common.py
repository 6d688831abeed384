"""What every ``dtsim`` command shares: the consoles, user text made safe for the terminal,
output paths checked before work starts, and the bad-input exit.

Exit codes: 0 success, 2 bad input (one line naming file, line and field), 1 a bug.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from simulator.errors import ScenarioError

__all__ = ["console", "err_console", "fail", "guard", "cluster_spec", "safe", "printable", "one_line",
           "debug_enabled", "set_debug", "check_output_file", "check_output_dir", "print_table"]

console = Console()
err_console = Console(stderr=True)

# C0 and C1 control characters (ESC, BEL, CSI, OSC...), DEL, and the Unicode bidirectional
# overrides and isolates that can reorder what a terminal shows
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_debug = False


def printable(text: object) -> str:
    """``text`` with every control character (and bidi override) written as a visible escape
    (``\\x1b``), so it cannot move the cursor, retitle the terminal or recolour what follows.
    Newlines and tabs become escapes too: one message stays one line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def safe(text: object) -> str:
    """User-controlled ``text`` ready to embed in rich markup: control characters escaped
    (:func:`printable`) and console markup (``[bold]``, ``[/oops]``, ``[link=...]``) taken
    literally. Trailing backslashes are doubled so that a tag written after the text stays a
    tag (``f"[bold]{safe(name)}[/]"``)."""
    plain = printable(text)
    body = plain.rstrip("\\")
    return escape(body) + "\\" * (2 * (len(plain) - len(body)))


def one_line(text: object, limit: int = 1200) -> str:
    """``text`` on one line (whitespace runs with newlines collapsed), at most ``limit`` characters (long enough for
    any message dtsim writes, short enough that a hostile value cannot flood the terminal)."""
    flat = re.sub(r"\s*\n\s*", " ", str(text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def print_table(table: Any, out: Console | None = None) -> None:
    """Print a rich table without cutting a cell: give its columns ``no_wrap=True`` (numbers) or
    ``overflow="fold"`` (text, folded onto more lines). When the terminal is too narrow for the
    no-wrap columns (rich would end a cell with an ellipsis), the table is printed as wide as it
    needs (the terminal wraps the lines; nothing is cut). Not on a terminal, at least 132 columns."""
    import io

    out = out or console
    width = out.width if out.is_terminal else max(out.width, 132)
    while width < 1000:
        probe = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
        probe.print(table)
        if "\u2026" not in probe.file.getvalue():  # type: ignore[attr-defined]
            break
        width += 4
    if width == out.width:
        out.print(table)
        return
    Console(file=out.file, width=width, force_terminal=out.is_terminal, no_color=out.no_color,
            highlight=False).print(table)


def debug_enabled() -> bool:
    """``dtsim --debug`` or ``DTSIM_DEBUG=1``: show tracebacks."""
    return _debug or os.environ.get("DTSIM_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def set_debug(value: bool) -> None:
    global _debug
    _debug = value


def fail(message: str) -> None:
    """Print ``error: message`` on stderr (one line, escaped) and exit with status 2 (bad input)."""
    err_console.print(f"[bold red]error:[/] {safe(one_line(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def guard(fn: Callable[[], Any]) -> Any:
    """``fn()``, turning a :class:`~simulator.errors.ScenarioError` into :func:`fail` (with
    the traceback first under ``--debug``)."""
    try:
        return fn()
    except ScenarioError as exc:
        if debug_enabled():
            traceback.print_exc()
        fail(str(exc))


def cluster_spec(data: dict[str, Any]) -> Any:
    """A validated :class:`~simulator.scenario.ClusterSpec` from command-line options; bad
    values raise a located :class:`~simulator.errors.ScenarioError` (for :func:`guard`)."""
    from pydantic import ValidationError

    from simulator.scenario import ClusterSpec
    from simulator.yamlio import error_from_validation

    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise error_from_validation(exc) from None


# ----------------------------------------------------------------------------------------
# output paths: checked before any work, so a bad target costs nothing and never a traceback


def _shown(path: Path) -> str:
    """``path`` for a message: whole when short, else its start and end."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-50:]}"


def _check_names(path: Path, option: str) -> Path:
    """``path`` made absolute, after checking every name on it against the file system's
    limits (before anything stats it: a too-long name makes ``stat`` itself fail)."""
    absolute = Path(os.path.abspath(path))
    raw = Path.cwd() / path  # as the system will walk it, ``..`` and all
    try:
        name_max, path_max = os.pathconf("/", "PC_NAME_MAX"), os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        name_max, path_max = 255, 4096
    long = next((part for part in raw.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        fail(f"{option} {_shown(path)}: the name {long[:40]}... is longer than the file system allows ({name_max} bytes)")
    if len(os.fsencode(str(raw))) >= path_max:
        fail(f"{option} {_shown(path)}: the path is longer than the file system allows ({path_max} bytes)")
    return absolute


def _probe(directory: Path, option: str, path: Path) -> None:
    """Create and remove a file in ``directory``: the one test that also holds for root and
    for read-only file systems."""
    probe = directory / f".dtsim-write-probe-{os.getpid()}"
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except FileExistsError:  # a probe of this pid left behind: files can be created here
        return
    except OSError as exc:
        fail(f"{option} {_shown(path)}: cannot write in {directory} ({exc.strerror or exc})")


def _writable_ancestor(absolute: Path, option: str, path: Path) -> None:
    """The nearest existing ancestor of ``absolute`` must be a directory this process can
    create files in (the writer creates the missing folders below it)."""
    ancestor = absolute.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        fail(f"{option} {_shown(path)}: {ancestor} is not a directory")
    _probe(ancestor, option, path)


def check_output_file(path: Path | None, option: str) -> None:
    """Exit 2 with one line unless ``path`` (when given) can be written as a file: not a
    directory, an existing file writable, its folder (or the nearest existing one, whose
    missing sub-folders the writer creates) a writable directory, every name within limits."""
    try:
        _check_file(path, option)
    except OSError as exc:  # a folder on the way that cannot be searched, ...
        fail(f"{option} {_shown(path) if path else path}: {exc.strerror or exc}")


def check_output_dir(path: Path | None, option: str, *, inside: tuple[str, ...] = ()) -> None:
    """Exit 2 with one line unless ``path`` (when given) is, or can be created as, a writable
    directory; ``inside`` names sub-folders the command writes (e.g. ``cache``) that must not
    be files either."""
    try:
        _check_dir(path, option, inside)
    except OSError as exc:
        fail(f"{option} {_shown(path) if path else path}: {exc.strerror or exc}")


def _check_file(path: Path | None, option: str) -> None:
    if path is None:
        return
    absolute = _check_names(path, option)
    if str(path) in ("", ".") or path.is_dir() or str(path).endswith(os.sep):
        fail(f"{option} {_shown(path)}: is a directory; give a file name")
    if path.exists():  # written in place (also /dev/null, /dev/stdout)
        if not os.access(path, os.W_OK):
            fail(f"{option} {_shown(path)}: the file is not writable")
        return
    _writable_ancestor(absolute, option, path)


def _check_dir(path: Path | None, option: str, inside: tuple[str, ...]) -> None:
    if path is None:
        return
    absolute = _check_names(path, option)
    if path.exists() and not path.is_dir():
        fail(f"{option} {_shown(path)}: is a file, not a directory")
    for name in inside:
        sub = path / name
        if sub.exists() and not sub.is_dir():
            fail(f"{option} {_shown(path)}: {_shown(sub)} is a file, not a directory")
    if path.is_dir():
        _probe(path, option, path)
        return
    _writable_ancestor(absolute / "x", option, path)
