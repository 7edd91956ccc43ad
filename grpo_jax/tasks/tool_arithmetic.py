"""Arithmetic on 3-5 digit operands, which a tiny model cannot do in its head but can do with
the calculator tool.

Problem: "a op b" with op in + - *, e.g. "4821*367". Clean worked solution: one call,
the environment's answer, and the answer copied out of it:

    <think><calc>4821*367</calc><result>1769307</result></think><answer>1769307</answer>

The observation `<result>...</result>` is what `grpo_jax.tools` writes after the call, so in
a multi-turn rollout (`rl.tools=calc`) the environment, not the model, writes those tokens.

Noisy worked solutions (the pretraining data) use the tool only with probability
`tool_rate`; otherwise they answer "in head" (`<think>4821*367</think><answer>...</answer>`,
right or wrong, which a tiny model cannot learn to compute). Each trace is disturbed with
probability `error_rate`: a tool trace miscopies one digit of an operand into the call (the
answer is then the tool's answer to the wrong call), or one digit of the result into the
answer; an in-head trace gets a wrong answer. A model pretrained on them calls the tool
sometimes and copies carefully most of the time: RL has both the call rate and the copying
to raise.
"""

from __future__ import annotations

import re

import numpy as np

from grpo_jax.tasks.base import Example, Task, check_rate
from grpo_jax.tasks.registry import register_task
from grpo_jax.tools import call_tool, find_call, render_observation
from grpo_jax.tools.calculator import evaluate as evaluate_expression

OPERATORS = "+-*"
# difficulty -> digits of each operand
_DIGITS = {1: 3, 2: 4, 3: 5}
# The call and observation tags (single tokens of the character tokenizer).
TOOL_TAGS = ("<calc>", "</calc>", "<result>", "</result>")


def _change_digit(text: str, rng: np.random.Generator) -> str:
    """`text` (digits) with one digit replaced by another (the first stays non-zero)."""
    i = int(rng.integers(len(text)))
    choices = [d for d in "0123456789" if d != text[i] and not (i == 0 and d == "0")]
    return text[:i] + choices[int(rng.integers(len(choices)))] + text[i + 1:]


@register_task("tool_arithmetic")
class ToolArithmeticTask(Task):
    """`a op b` with d-digit operands (difficulty 1, 2, 3: 3, 4, 5 digits; d > 3: d + 2)."""

    name = "tool_arithmetic"
    tags = TOOL_TAGS
    observations = r"<result>.*?</result>"  # the calculator's answers

    def __init__(self, difficulty=(1, 2, 3), *, tool_rate: float = 0.5):
        """Args: difficulty (int or list); tool_rate: the probability that a noisy worked
        solution calls the calculator (the rest answer in head)."""
        super().__init__(difficulty)
        self.tool_rate = check_rate("tool_rate", tool_rate)

    @staticmethod
    def digits(difficulty: int) -> int:
        return _DIGITS.get(difficulty, difficulty + 2)

    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        digits = self.digits(difficulty)
        a, b = (int(v) for v in rng.integers(10 ** (digits - 1), 10 ** digits, size=2))
        operator = OPERATORS[int(rng.integers(len(OPERATORS)))]
        expression = f"{a}{operator}{b}"
        value = call_tool("calc", expression)
        return Example(id=f"tool_arithmetic:{expression}", prompt=expression, answer=value,
                       solution=self._trace(expression, value, value), difficulty=difficulty,
                       meta={"expression": expression})

    @staticmethod
    def _trace(call: str | None, result: str | None, answer: str) -> str:
        if call is None:
            return f"<think>{result}</think><answer>{answer}</answer>"
        return (f"<think><calc>{call}</calc>{render_observation(result)}</think>"
                f"<answer>{answer}</answer>")

    def solution(self, example: Example, *, rng, error_rate: float,
                 format_error_rate: float = 0.0) -> tuple[str, bool]:
        """A noisy worked solution (module docstring); (completion, is_correct)."""
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        expression, value = example.meta["expression"], example.answer
        noisy = rng.random() < error_rate
        if rng.random() >= self.tool_rate:  # in head
            answer = _change_digit(value.lstrip("-"), rng) if noisy else value.lstrip("-")
            answer = ("-" if value.startswith("-") else "") + answer
            text = self._trace(None, expression, answer)
        else:
            call = expression
            if noisy and rng.random() < 0.5:  # a miscopied operand
                a, operator, b = re.fullmatch(r"(\d+)([-+*])(\d+)", expression).groups()
                a, b = (_change_digit(a, rng), b) if rng.random() < 0.5 else \
                    (a, _change_digit(b, rng))
                call = f"{a}{operator}{b}"
                noisy = False
            result = call_tool("calc", call)
            answer = result
            if noisy:  # a miscopied answer
                sign = "-" if result.startswith("-") else ""
                answer = sign + _change_digit(result.lstrip("-"), rng)
            text = self._trace(call, result, answer)
        if rng.random() < format_error_rate:
            text = text.replace("</answer>", "")
        return text, self.is_correct(text, example)

    def correct_call(self, completion: str, example: Example) -> float:
        """1.0 when the completion calls the calculator on an expression whose value is the
        reference answer (correct tool use), else 0.0."""
        text = completion
        while (call := find_call(text, ("calc",))) is not None:
            try:
                if str(evaluate_expression(call.argument)) == example.answer:
                    return 1.0
            except Exception:  # noqa: BLE001  (a malformed call is not a correct one)
                pass
            text = text[call.end:]
        return 0.0

    def reward_fns(self):
        """The base rewards plus "correct_call" (`correct_call`)."""
        return {**super().reward_fns(), "correct_call": self.correct_call}
