"""Safe evaluation of countdown expressions, and the countdown rewards.

Model text is never passed to `eval` / `exec`. The text is length-capped, parsed with
`ast.parse(mode="eval")`, and walked: only integer literals, `+ - * /`, unary `+ -` and
parentheses are allowed; arithmetic is exact (`fractions.Fraction`); division by zero, a node
count over the cap, or an intermediate beyond the magnitude cap make the expression invalid.

Countdown (TinyZero, https://github.com/Jiayi-Pan/TinyZero): use every given number exactly
once with + - * / to reach the target.
"""

from __future__ import annotations

import ast
import warnings
from fractions import Fraction
from typing import Sequence

from grpo_jax.rewards.parsing import extract_answer

MAX_EXPRESSION_CHARS = 200
MAX_EXPRESSION_NODES = 64
MAX_MAGNITUDE = 10**12

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class _Invalid(Exception):
    pass


def _check_magnitude(value: Fraction, max_magnitude: int) -> Fraction:
    if abs(value.numerator) > max_magnitude or value.denominator > max_magnitude:
        raise _Invalid("magnitude")
    return value


def _evaluate(node, numbers: list[int], max_magnitude: int) -> Fraction:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _Invalid("literal")
        numbers.append(value)
        return _check_magnitude(Fraction(value), max_magnitude)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _evaluate(node.operand, numbers, max_magnitude)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _evaluate(node.left, numbers, max_magnitude)
        right = _evaluate(node.right, numbers, max_magnitude)
        if isinstance(node.op, ast.Add):
            result = left + right
        elif isinstance(node.op, ast.Sub):
            result = left - right
        elif isinstance(node.op, ast.Mult):
            result = left * right
        else:
            if right == 0:
                raise _Invalid("division by zero")
            result = left / right
        return _check_magnitude(result, max_magnitude)
    raise _Invalid(type(node).__name__)


def parse_expression(
    text: str,
    *,
    max_chars: int = MAX_EXPRESSION_CHARS,
    max_nodes: int = MAX_EXPRESSION_NODES,
    max_magnitude: int = MAX_MAGNITUDE,
) -> tuple[Fraction, list[int]] | None:
    """Evaluates an arithmetic expression exactly, returning its value and its literals.

    "x" and "×" are read as "*", "÷" as "/". With one "=", the left side is evaluated.

    Args:
      text: expression such as "(3+5)*2".
      max_chars: longer text is invalid.
      max_nodes: an AST with more nodes is invalid.
      max_magnitude: a literal or intermediate with |numerator| or denominator above it is invalid.

    Returns:
      (value, integer literals in reading order), or None when the text is not a valid
      expression within the caps (never raises).
    """
    if not isinstance(text, str) or len(text) > max_chars:
        return None
    text = text.replace("×", "*").replace("x", "*").replace("÷", "/")
    if text.count("=") == 1:
        text = text.split("=")[0]
    if not text.strip() or "**" in text or "//" in text:
        return None
    try:
        with warnings.catch_warnings():  # e.g. SyntaxWarning "invalid decimal literal"
            warnings.simplefilter("ignore")
            tree = ast.parse(text.strip(), mode="eval")
        if sum(1 for _ in ast.walk(tree)) > max_nodes:
            return None
        numbers: list[int] = []
        value = _evaluate(tree.body, numbers, max_magnitude)
        return value, numbers
    except (_Invalid, SyntaxError, ValueError, TypeError, RecursionError, MemoryError,
            OverflowError):
        return None


def check_countdown(expression: str | None, numbers: Sequence[int], target) -> bool:
    """Whether `expression` uses each of `numbers` exactly once and equals `target`.

    Args:
      expression: the candidate, e.g. "3*4+5".
      numbers: the given numbers (a multiset).
      target: the number to reach.

    Returns:
      True for a valid, correct expression.
    """
    parsed = parse_expression(expression) if isinstance(expression, str) else None
    if parsed is None:
        return False
    value, used = parsed
    try:
        return sorted(used) == sorted(int(n) for n in numbers) and value == Fraction(target)
    except (TypeError, ValueError):
        return False


def _numbers_target(example):
    meta = getattr(example, "meta", None)
    if meta is None and isinstance(example, dict):
        meta = example.get("meta", example)
    if not isinstance(meta, dict) or "numbers" not in meta or "target" not in meta:
        return None
    return meta["numbers"], meta["target"]


def countdown_reward(completion: str, example) -> float:
    """1.0 if the answer-tag expression is a correct countdown solution for `example`, else 0.0.

    Args:
      completion: the generated text.
      example: an Example whose `meta` has "numbers" and "target".

    Returns:
      1.0 or 0.0.
    """
    problem = _numbers_target(example)
    if problem is None:
        return 0.0
    return 1.0 if check_countdown(extract_answer(completion), *problem) else 0.0


def countdown_tinyzero_reward(
    completion: str, example, *, format_score: float = 0.1, correct_score: float = 1.0
) -> float:
    """TinyZero countdown scoring: 0 without an answer tag, 0.1 if wrong, 1.0 if correct.

    Args:
      completion: the generated text.
      example: an Example whose `meta` has "numbers" and "target".
      format_score: score of a well-formed (answer tags present) but wrong answer.
      correct_score: score of a correct answer.

    Returns:
      0.0, format_score or correct_score.
    """
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    problem = _numbers_target(example)
    if problem is not None and check_countdown(answer, *problem):
        return float(correct_score)
    return float(format_score)
