"""Countdown: reach a target from 3-4 numbers with + - * /, each number used exactly once.

As in TinyZero (https://github.com/Jiayi-Pan/TinyZero). A problem is generated from a random
plan: repeatedly combine two of the remaining values with an operator (exact division only,
intermediate values positive integers) until one value, the target, is left.

Worked solution: the plan's steps, e.g. "<think>3*4=12 12+5=17</think><answer>3*4+5</answer>".
Noisy solutions: each step independently uses a wrong operator with probability
`error_rate` (a different operator, computed correctly, chosen so that the rest of the plan
stays integer-valued and the final value differs from the target); the answer expression
follows the trace, so it is wrong iff some step was. (A wrong operator rather than a wrong
sum: the answer is an expression, whose value an arithmetic slip in the trace would not change.)

Rewards: "accuracy" (1/0, checked by the AST evaluator of grpo_jax.rewards.expression),
"tinyzero" (0 without an answer tag, 0.1 if wrong, 1.0 if correct), "format", "format_soft".
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

from grpo_jax.rewards.expression import check_countdown, countdown_tinyzero_reward
from grpo_jax.tasks.base import Example, Task, check_rate
from grpo_jax.tasks.registry import register_task

OPERATORS = "+-*/"
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
# difficulty -> (how many numbers, largest number)
_LEVELS = {1: (3, 9), 2: (4, 9), 3: (4, 25)}
MAX_TARGET = 100


def _apply(left: Fraction, operator: str, right: Fraction) -> Fraction | None:
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    return None if right == 0 else left / right


def run_plan(numbers: Sequence[int], plan: Sequence[Sequence], operators: Sequence[str]):
    """Values of the plan's steps; None if a division by zero or a fraction appears.

    Args:
      numbers: the given numbers, length C.
      plan: steps [left_ref, right_ref]; a ref < C is a number, ref >= C the result of step ref-C.
      operators: one operator per step.

    Returns:
      list of step results (ints) or None.
    """
    values = [Fraction(n) for n in numbers]
    results = []
    for (left, right), operator in zip(plan, operators):
        result = _apply(values[left], operator, values[right])
        if result is None or result.denominator != 1:
            return None
        values.append(result)
        results.append(int(result))
    return results


def plan_expression(numbers: Sequence[int], plan: Sequence[Sequence], operators: Sequence[str]) -> str:
    """The plan as one expression with the fewest parentheses, e.g. "3*4+5"."""
    texts = [(str(n), 3) for n in numbers]  # (text, precedence of its top operator)
    for (left, right), operator in zip(plan, operators):
        precedence = _PRECEDENCE[operator]
        left_text, left_precedence = texts[left]
        right_text, right_precedence = texts[right]
        if left_precedence < precedence:
            left_text = f"({left_text})"
        if right_precedence < precedence or (right_precedence == precedence and operator in "-/"):
            right_text = f"({right_text})"
        texts.append((f"{left_text}{operator}{right_text}", precedence))
    return texts[-1][0]


@register_task("countdown")
class CountdownTask(Task):
    """Countdown problems; difficulty 1: 3 numbers 1-9, 2: 4 numbers 1-9, 3: 4 numbers 1-25,
    d > 3: 4 numbers 1-99 (TinyZero's range). Targets are 1..100.

    Args:
      difficulty: int or list of ints.
      prompt_style: "short" ("Use 3 4 5 to make 17") or "long" (a full sentence).
    """

    name = "countdown"

    def __init__(self, difficulty: int | Sequence[int] = 1, prompt_style: str = "short"):
        super().__init__(difficulty)
        if prompt_style not in ("short", "long"):
            raise ValueError(f"prompt_style: expected 'short' or 'long', got {prompt_style!r}")
        self.prompt_style = prompt_style

    @staticmethod
    def level(difficulty: int) -> tuple[int, int]:
        """(how many numbers, largest number) at a difficulty."""
        return _LEVELS.get(difficulty, (4, 99))

    def question(self, numbers: Sequence[int], target: int) -> str:
        listed = " ".join(str(n) for n in numbers)
        if self.prompt_style == "short":
            return f"Use {listed} to make {target}"
        return (f"Using each of the numbers {', '.join(str(n) for n in numbers)} exactly once, "
                f"with + - * / and parentheses, write an expression equal to {target}.")

    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        count, largest = self.level(difficulty)
        for _ in range(10_000):
            numbers = [int(v) for v in rng.integers(1, largest + 1, size=count)]
            plan, operators, available = [], [], list(range(count))
            values = {i: n for i, n in enumerate(numbers)}
            while len(available) > 1:
                first, second = rng.choice(len(available), size=2, replace=False)
                left, right = available[int(first)], available[int(second)]
                choices = [op for op in OPERATORS if _valid_step(values[left], op, values[right])]
                if not choices:
                    break
                operator = choices[int(rng.integers(len(choices)))]
                values[count + len(plan)] = int(_apply(Fraction(values[left]), operator,
                                                       Fraction(values[right])))
                plan.append([left, right])
                operators.append(operator)
                available = [a for a in available if a not in (left, right)] + [count + len(plan) - 1]
            else:
                target = values[available[0]]
                if 1 <= target <= MAX_TARGET:
                    return self._example(numbers, target, plan, operators, difficulty)
        raise RuntimeError("countdown: could not generate a problem")  # not reached in practice

    def _example(self, numbers, target, plan, operators, difficulty) -> Example:
        results = run_plan(numbers, plan, operators)
        thinking = _trace(numbers, plan, operators, results)
        answer = plan_expression(numbers, plan, operators)
        key = ",".join(str(n) for n in sorted(numbers))
        return Example(
            id=f"countdown:{key}->{target}",
            prompt=self.question(numbers, target),
            answer=answer,
            solution=f"<think>{thinking}</think><answer>{answer}</answer>",
            difficulty=difficulty,
            meta={"numbers": list(numbers), "target": int(target), "plan": plan,
                  "operators": list(operators), "steps": len(plan)},
        )

    def solution(self, example: Example, *, rng, error_rate: float,
                 format_error_rate: float = 0.0) -> tuple[str, bool]:
        """Worked solution where each step uses a wrong operator with probability `error_rate`.

        Args:
          example: a countdown Example (uses meta "numbers", "target", "plan", "operators").
          rng: numpy Generator or int seed.
          error_rate: per-step probability of a wrong operator.
          format_error_rate: probability that the trace is malformed.

        Returns:
          (completion, is_correct).
        """
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        numbers, target = example.meta["numbers"], example.meta["target"]
        plan, operators = example.meta["plan"], list(example.meta["operators"])
        for step, wrong in enumerate(rng.random(len(plan)) < error_rate):
            if not wrong:
                continue
            candidates = []
            for operator in OPERATORS:
                if operator == operators[step]:
                    continue
                trial = operators[:step] + [operator] + operators[step + 1 :]
                results = run_plan(numbers, plan, trial)
                if results is not None and results[-1] != target:
                    candidates.append(operator)
            if candidates:
                operators[step] = candidates[int(rng.integers(len(candidates)))]
        results = run_plan(numbers, plan, operators)
        thinking = _trace(numbers, plan, operators, results)
        answer = plan_expression(numbers, plan, operators)
        return self.finish_solution(example, thinking, answer, rng, format_error_rate)

    def check_answer(self, answer: str, example: Example) -> bool:
        return check_countdown(answer, example.meta["numbers"], example.meta["target"])

    def reward_fns(self):
        fns = super().reward_fns()
        fns["tinyzero"] = countdown_tinyzero_reward
        return fns


def _valid_step(left: int, operator: str, right: int) -> bool:
    """Generation keeps intermediate values positive integers."""
    if operator == "-":
        return left > right
    if operator == "/":
        return left % right == 0
    return True


def _trace(numbers, plan, operators, results) -> str:
    values = list(numbers) + list(results)
    return " ".join(f"{values[left]}{operator}{values[right]}={result}"
                    for (left, right), operator, result in zip(plan, operators, results))
