"""A calculator over exact integers and rationals: an AST evaluator with caps, never `eval`.

    calculate("3 * (4 + 5) / 6")   -> "9/2"
    calculate("2 ** 10 - 1")       -> "1023"
    calculate("1 / 0")             -> "error: division by zero"

Only number literals, + - * / // % ** and parentheses are read (`ast.parse(mode="eval")`,
then a walk that accepts those nodes and nothing else: no names, calls, attributes,
subscripts, comparisons or strings). Values are `fractions.Fraction`s, so 1/3 + 1/6 is
exactly 1/2; a decimal literal (2.5) is read as the fraction it spells. Every way a call
can blow up is capped before it is computed: the text's length, the tree's size and depth,
the exponent, and the bit length of every intermediate numerator and denominator. A bad
call is an observation ("error: ..."), never an exception.
"""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_CHARS = 256  # the expression's length
MAX_NODES = 128  # AST nodes
MAX_DEPTH = 24  # nesting
MAX_BITS = 2048  # of any numerator or denominator along the way
MAX_EXPONENT = 1024

_BINARY = {ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow}
_UNARY = {ast.UAdd, ast.USub}


class CalculatorError(ValueError):
    """A call the calculator refuses or cannot compute (its message is the observation)."""


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _check_size(x: Fraction) -> Fraction:
    if _bits(x) > MAX_BITS:
        raise CalculatorError(f"a number has more than {MAX_BITS} bits")
    return x


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError("only whole-number exponents are supported")
    n = exponent.numerator
    if abs(n) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent is larger than {MAX_EXPONENT}")
    if base == 0 and n < 0:
        raise CalculatorError("division by zero")
    if _bits(base) * abs(n) > MAX_BITS:  # decided before computing it
        raise CalculatorError(f"the result would have more than {MAX_BITS} bits")
    return base ** n


def _apply(op: ast.operator, a: Fraction, b: Fraction) -> Fraction:
    if isinstance(op, ast.Pow):
        return _power(a, b)
    if isinstance(op, ast.Mult) and _bits(a) + _bits(b) > MAX_BITS:
        raise CalculatorError(f"the result would have more than {MAX_BITS} bits")
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
        raise CalculatorError("division by zero")
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.Div):
        return a / b
    if isinstance(op, ast.FloorDiv):
        return Fraction(a // b)
    return a % b


def _literal(node: ast.Constant) -> Fraction:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"unsupported literal {value!r}")
    if isinstance(value, float):
        source = repr(value)
        if "inf" in source or "nan" in source:
            raise CalculatorError("unsupported literal")
        return Fraction(source)  # the decimal it spells, not the binary float
    return Fraction(value)


def _evaluate(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression is nested more than {MAX_DEPTH} deep")
    if isinstance(node, ast.Constant):
        return _check_size(_literal(node))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a = _evaluate(node.left, depth + 1)
        b = _evaluate(node.right, depth + 1)
        return _check_size(_apply(node.op, a, b))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _evaluate(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; raises CalculatorError (one line)."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be text")
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CalculatorError("not an arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"the expression has more than {MAX_NODES} parts")
    return _evaluate(tree.body, 0)


def format_value(value: Fraction) -> str:
    """An integer as its digits, a fraction as "p/q" (lowest terms, sign on p)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def calculate(expression: str) -> str:
    """The observation for a calculator call: the exact value, or "error: <why>"."""
    try:
        return format_value(evaluate(expression))
    except CalculatorError as err:
        return f"error: {err}"
