"""A tiny, safe arithmetic language for derived sweep values (no ``eval``).

    "{cluster.nodes} * 8 * 4"          -> 128 when cluster.nodes is 4
    "max(1, {training.global_batch} // 2)"

Grammar: integer and float literals, references ``{dotted.field.path}`` to values of the
point being built, ``+ - * / // % **``, unary ``+ -``, parentheses and the functions
``min``, ``max``, ``abs``, ``round``, ``ceil``, ``floor``. Anything else (names,
attributes, strings, comparisons, calls of other functions) is rejected before anything is
computed. The expression is parsed with :mod:`ast` and walked node by node; a float result
that is a whole number comes back as an ``int`` (so ``"{x} / 2"`` can feed an integer
field).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from simulator import limits

__all__ = ["ExpressionError", "references", "evaluate"]

_REF = re.compile(r"\{([^{}]+)\}")
_MAX_EXPONENT = 64  # keeps "2 ** 10**9" from eating the machine
_MAX_LENGTH = 500

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "ceil": math.ceil,
    "floor": math.floor,
}


class ExpressionError(ValueError):
    """The expression is not in the grammar, references a missing value, or cannot be computed."""


def references(text: str) -> list[str]:
    """Dotted field paths referenced as ``{path}`` in ``text``, in order of appearance."""
    return [m.group(1).strip() for m in _REF.finditer(text)]


def evaluate(text: str, values: Mapping[str, Any]) -> int | float:
    """Value of ``text`` with each ``{path}`` replaced by ``values[path]`` (a number).

    Raises :class:`ExpressionError` naming the problem (unknown reference, non-numeric
    value, forbidden construct, division by zero).
    """
    if len(text) > _MAX_LENGTH:
        raise ExpressionError(f"expression longer than {_MAX_LENGTH} characters")
    names: dict[str, int | float] = {}

    def substitute(match: re.Match[str]) -> str:
        path = match.group(1).strip()
        if path not in values:
            raise ExpressionError(f"{{{path}}} is not a field of this point")
        value = values[path]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ExpressionError(f"{{{path}}} is {value!r}, not a number")
        name = f"_v{len(names)}"
        names[name] = value
        return f" {name} "

    source = _REF.sub(substitute, text)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        raise ExpressionError(f"cannot parse {text!r} as arithmetic") from None
    try:
        result = _eval(tree.body, names)
    except ZeroDivisionError:
        raise ExpressionError(f"division by zero in {text!r}") from None
    except (OverflowError, TypeError, ValueError) as exc:
        raise ExpressionError(f"cannot compute {text!r}: {exc}") from None
    if isinstance(result, float) and math.isfinite(result) and result.is_integer():
        return int(result)
    return result


def _eval(node: ast.AST, names: Mapping[str, int | float]) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, names), _eval(node.right, names)
        if isinstance(node.op, ast.Pow):
            if abs(right) > _MAX_EXPONENT:
                raise ExpressionError(f"exponent {right} is larger than {_MAX_EXPONENT}")
            _check_power(left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, names))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords and node.args):
        return _bounded(_FUNCTIONS[node.func.id](*(_eval(arg, names) for arg in node.args)))
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"name {node.id!r} (write field references as {{section.field}})"
    elif isinstance(node, ast.Call):
        what = "a call (allowed: " + ", ".join(sorted(_FUNCTIONS)) + ")"
    raise ExpressionError(f"{what} is not allowed in a derived value")


def _check_power(base: Any, exponent: Any) -> None:
    """Refuse ``base ** exponent`` before computing it when the result would need more than
    ``expression_bits`` bits (:mod:`simulator.limits`): each exponent is at most 64, but
    nested powers (``((2**64)**64)**64``) grow the base without bound."""
    if isinstance(base, (int, float)) and isinstance(exponent, (int, float)) and abs(base) > 1 and exponent > 0:
        bits = exponent * math.log2(abs(base))
        if bits > limits.get("expression_bits"):
            raise ExpressionError(str(limits.exceeded("expression_bits", math.ceil(bits),
                                                      what=f"size of {base:.6g} ** {exponent:g}")))


def _bounded(value: Any) -> Any:
    """``value`` when it is a real number of at most ``expression_bits`` bits and finite."""
    if isinstance(value, complex):
        raise ExpressionError("the result is not a real number (a fractional power of a negative number)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError("the result is not a finite number")
    if isinstance(value, int) and value.bit_length() > limits.get("expression_bits"):
        raise ExpressionError(str(limits.exceeded("expression_bits", value.bit_length(), what="size of a value")))
    return value

