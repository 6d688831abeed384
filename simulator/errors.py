"""Errors the simulator raises on purpose.

* :class:`ScenarioError`: the input is malformed (unknown key, wrong type, bad unit,
  unknown preset or node type, broken YAML, missing file). The CLI prints its one-line
  message and exits with code 2.
* :class:`InfeasibleError`: the input is well formed but asks for something impossible
  (tp does not divide the heads, the world size does not match the parallel layout, the
  global batch does not split into micro-batches). Also exit code 2; sweeps record it as
  an infeasible point instead of aborting.

Both carry the dotted ``field`` path they concern and, when known, the ``file`` and
``line`` it came from, so the message can name all three.
"""

from __future__ import annotations

__all__ = ["ScenarioError", "InfeasibleError"]


class ScenarioError(Exception):
    """Bad input: the message names the file, line and field when they are known."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        file: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.file = file
        self.line = line

    def located(self, *, file: str | None = None, line: int | None = None) -> ScenarioError:
        """Return a copy of this error with a file (and line) filled in where missing."""
        clone = type(self)(
            self.message,
            field=self.field,
            file=self.file or file,
            line=self.line if self.line is not None else line,
        )
        return clone

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line is not None else "")
        parts = [p for p in (where, self.field) if p]
        prefix = ": ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message


class InfeasibleError(ScenarioError):
    """Valid input that describes an impossible setup (e.g. tp does not divide heads)."""
