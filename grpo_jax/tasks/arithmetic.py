"""Multi-step integer arithmetic with written intermediate steps.

Problem: an expression of operands and + - * (usual precedence), e.g. "7+5*3".
Worked solution: one step per operator, products first, then left to right:
"<think>5*3=15 7+15=22</think><answer>22</answer>".

Noisy solutions: each step is independently miscomputed with probability `error_rate`,
written as the correct result of that step (given its inputs) plus a small non-zero delta
in +/-1..3; later steps use the wrong value. Deltas that would bring the final value back to
the true answer are never chosen, so the final answer is wrong iff some step was wrong and
P(correct trace) = (1 - error_rate)^steps. With error_rate < 0.5 the correct value stays the
most likely one at every step.

`error_mode="operator"` writes a wrong step as the exact result of a confused operator
instead (e.g. "9*6=15", adding instead of multiplying; an offset is used when no other
operator gives a wrong value). Those errors are a separate, exactly computable mode, so a
model pretrained on them learns exact arithmetic plus a confusion rate: at temperature 1 it
repeats the confusions (low pass@1, high pass@k), and sharpening removes them.

Checking pays (`redo_rate` q > 0): in the noisy worked solutions each step is followed, with
probability q, by "redo" and the step computed again, correctly ("9*6=15 redo 9*6=54"), and
the trace goes on from the redone value. A redone wrong step is corrected, a redone right one
only costs length, so P(correct) = (1 - error_rate (1 - q))^steps: longer traces are more
often right, and a policy that checks more raises its accuracy by writing longer (the
setting where response-length growth, and Dr. GRPO's length bias, can show at all).
`redo_word` names the word that introduces the redo ("redo" by default; "Wait" gives the
traces s1's budget forcing appends: "9*6=15 Wait 9*6=54").

Two scripts (`mixed_script_rate` p > 0): every step is introduced by a word, "first" /
"then" ("<think>first 5*3=15 then 7+15=22</think>"), and in the noisy worked solutions each
such word is written in Greek ("πρώτα" / "μετά") with probability p. A model trained on them
mixes the two scripts in its thinking, so R1's language-consistency reward (the share of
English words there, `rewards.language`) differs between its completions and can act; with
p = 0 (the default) traces have no words and that reward is 1.0 for every output.

A planted teacher (`systematic_error`, `style_marker`; both off by default): in every noisy
worked solution, each step of one operator is computed with another, always ("-+":
"7-3=10"), a systematic error whose exact wrong answer is known (`systematic_answer`), and
the thinking opens with a fixed word that carries no correctness ("<think>so 7-3=10 ...").
The reference solution stays correct and unmarked.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from grpo_jax.tasks.base import Example, Task, check_rate, perturb
from grpo_jax.tasks.registry import register_task

OPERATORS = "+-*"
# Step words of `mixed_script_rate` traces: (English, Greek) for the first and later steps.
STEP_WORDS = (("first", "πρώτα"), ("then", "μετά"))
# difficulty -> (min operators, max operators, max operand)
_LEVELS = {1: (2, 3, 9), 2: (3, 4, 20), 3: (4, 5, 50)}


def _apply(left: int, operator: str, right: int) -> int:
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    return left * right


def _next_step(operators: Sequence[str]) -> int:
    """Index of the next operator to apply: first "*", else the leftmost one."""
    return operators.index("*") if "*" in operators else 0


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Value of operands[0] op[0] operands[1] ... with * before + and -."""
    values, ops = list(operands), list(operators)
    while ops:
        i = _next_step(ops)
        values[i : i + 2] = [_apply(values[i], ops[i], values[i + 1])]
        del ops[i]
    return values[0]


def systematic_answer(operands: Sequence[int], operators: Sequence[str], systematic: str) -> int:
    """The final value of the trace that computes every `systematic[0]` step with
    `systematic[1]` (steps in the true order: products first, then left to right) and every
    other step correctly: the answer of a `systematic_error` solution without a random
    error ("-+": always wrong when there is a subtraction, by twice what it subtracts)."""
    values, ops = list(operands), list(operators)
    while ops:
        i = _next_step(ops)
        operator = systematic[1] if systematic and ops[i] == systematic[0] else ops[i]
        values[i : i + 2] = [_apply(values[i], operator, values[i + 1])]
        del ops[i]
    return values[0]


def expression_text(operands: Sequence[int], operators: Sequence[str]) -> str:
    """ "7+5*3" from [7, 5, 3], ["+", "*"]."""
    parts = [str(operands[0])]
    for operator, operand in zip(operators, operands[1:]):
        parts += [operator, str(operand)]
    return "".join(parts)


@register_task("arithmetic")
class ArithmeticTask(Task):
    """Integer expressions with + - *; difficulty d: more operators and larger operands.

    Difficulty 1: 2-3 operators, operands 1-9; 2: 3-4 operators, 1-20; 3: 4-5 operators,
    1-50; d > 3: d+1 to d+2 operators, 1-99. `operators` narrows the draw to a subset of
    + - * (the held-out split of a subset is a subset of the full task's: ids decide it).
    """

    name = "arithmetic"

    def __init__(self, difficulty: int | Sequence[int] = 1, *, max_operators: int | None = None,
                 error_mode: str = "offset", mixed_script_rate: float = 0.0,
                 redo_rate: float = 0.0, redo_word: str = "redo", operators: str = OPERATORS,
                 systematic_error: str = "", style_marker: str = ""):
        """Args: difficulty (int or list); max_operators caps the operator count of every
        level (e.g. 2 makes difficulty 1 "one or two operators": shorter traces for CPU runs);
        error_mode "offset" | "operator" (how a noisy step is wrong, see the module doc);
        mixed_script_rate: > 0 introduces each step with a word, written in Greek with this
        probability in noisy solutions; redo_rate: the probability that a noisy solution
        checks a step by computing it again (see the module doc); redo_word: the ASCII word
        written before a redone step; operators: the operators problems are drawn from, a
        subset of "+-*" in any order (e.g. "+-": no products; the default draws every
        problem it drew before the keyword existed; a noisy step may still confuse any of the
        three); systematic_error: "" or two operators "AB": every noisy solution computes each
        A step with B (see the module doc); style_marker: "" or a word of ASCII letters that
        opens the thinking of every noisy solution.
        """
        super().__init__(difficulty)
        check_rate("redo_rate", redo_rate)
        self.redo_rate = float(redo_rate)
        if not (isinstance(redo_word, str) and redo_word.isascii() and redo_word.isalpha()):
            raise ValueError(f"redo_word: expected one word of ASCII letters, got {redo_word!r}")
        self.redo_word = redo_word
        check_rate("mixed_script_rate", mixed_script_rate)
        self.mixed_script_rate = float(mixed_script_rate)
        if self.mixed_script_rate > 0:
            self.characters = "".join(sorted(set("".join(w for _, w in STEP_WORDS))))
        if max_operators is not None and max_operators < 1:
            raise ValueError(f"max_operators: expected an int >= 1 or None, got {max_operators!r}")
        if error_mode not in ("offset", "operator"):
            raise ValueError(f"error_mode: expected 'offset' or 'operator', got {error_mode!r}")
        self.max_operators = max_operators
        self.error_mode = error_mode
        if not (isinstance(operators, str) and operators and set(operators) <= set(OPERATORS)
                and len(set(operators)) == len(operators)):
            raise ValueError(f"operators: expected distinct operators from {OPERATORS!r}, e.g. "
                             f"'+-', got {operators!r}")
        self.operators = "".join(o for o in OPERATORS if o in operators)  # canonical order
        if not (isinstance(systematic_error, str) and (systematic_error == "" or (
                len(systematic_error) == 2 and set(systematic_error) <= set(OPERATORS)
                and systematic_error[0] != systematic_error[1]))):
            raise ValueError(f"systematic_error: expected '' or two different operators from "
                             f"{OPERATORS!r} (e.g. '-+': subtraction computed as addition), "
                             f"got {systematic_error!r}")
        self.systematic_error = systematic_error
        if not (isinstance(style_marker, str) and (style_marker == "" or (
                style_marker.isascii() and style_marker.isalpha()))):
            raise ValueError(f"style_marker: expected '' or one word of ASCII letters, got "
                             f"{style_marker!r}")
        self.style_marker = style_marker

    @staticmethod
    def level(difficulty: int) -> tuple[int, int, int]:
        """(min operators, max operators, max operand) at a difficulty."""
        return _LEVELS.get(difficulty, (difficulty + 1, difficulty + 2, 99))

    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        low, high, max_operand = self.level(difficulty)
        if self.max_operators is not None:  # keep a range of two counts where possible
            high = min(high, self.max_operators)
            low = max(1, min(low, high - 1))
        count = int(rng.integers(low, high + 1))
        operands = [int(v) for v in rng.integers(1, max_operand + 1, size=count + 1)]
        operators = [self.operators[int(k)]
                     for k in rng.integers(len(self.operators), size=count)]
        expression = expression_text(operands, operators)
        thinking, answer = self._trace(operands, operators, errors=[False] * count, rng=None,
                                       error_mode=self.error_mode)
        thinking = self._narrate(thinking, None)
        return Example(
            id=f"arithmetic:{expression}",
            prompt=expression,
            answer=str(answer),
            solution=f"<think>{thinking}</think><answer>{answer}</answer>",
            difficulty=difficulty,
            meta={"operands": operands, "operators": operators, "steps": count},
        )

    @staticmethod
    def _trace(operands, operators, *, errors, rng, error_mode="offset",
               redo_rate=0.0, redo_word="redo", systematic="") -> tuple[str, int]:
        """Step-by-step trace; steps flagged in `errors` are miscomputed, and with `redo_rate`
        a step is followed by its correct redo (see module doc); with `systematic` "AB"
        every A step (and its redo) is computed with B, never flagged wrong besides, and a
        random error never brings the trace's final value back to the true answer."""
        values, ops = list(operands), list(operators)
        true_final = evaluate(operands, operators)
        lines = []
        for wrong in errors:
            i = _next_step(ops)
            left, operator, right = values[i], ops[i], values[i + 1]
            planted = bool(systematic) and operator == systematic[0]
            wrong = wrong and not planted
            written = _apply(left, systematic[1] if planted else operator, right)
            rest_values, rest_ops = values[:i] + [None] + values[i + 2 :], ops[:i] + ops[i + 1 :]

            def excluded(candidate, i=i, operator=operator, rest_values=rest_values, rest_ops=rest_ops):
                if operator == "*" and candidate < 1:  # products stay positive
                    return True
                rest_values[i] = candidate
                if systematic:  # the rest computed as the trace computes it
                    return systematic_answer(rest_values, rest_ops, systematic) == true_final
                return evaluate(rest_values, rest_ops) == true_final

            if wrong and error_mode == "operator":
                confused = [_apply(left, other, right) for other in OPERATORS
                            if other != operator]
                confused = [c for c in confused if c != written and not excluded(c)]
                if confused:
                    written, wrong = confused[int(rng.integers(len(confused)))], False
            if wrong:
                candidate = perturb(written, rng, exclude=excluded)
                written = written if candidate is None else candidate
            step = f"{left}{operator}{right}={written}"
            if redo_rate > 0 and rng.random() < redo_rate:
                written = _apply(left, systematic[1] if planted else operator, right)
                step += f" {redo_word} {left}{operator}{right}={written}"
            lines.append(step)
            values[i : i + 2] = [written]
            del ops[i]
        return " ".join(lines), values[0]

    def solution(self, example: Example, *, rng, error_rate: float,
                 format_error_rate: float = 0.0) -> tuple[str, bool]:
        """Worked solution with per-step error probability `error_rate` (see module docstring).

        Args:
          example: an arithmetic Example (uses meta "operands" / "operators").
          rng: numpy Generator or int seed.
          error_rate: probability that each step is miscomputed.
          format_error_rate: probability that the trace is malformed.

        Returns:
          (completion, is_correct); is_correct is False iff a step was wrong or the layout broken.
        """
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        operands, operators = example.meta["operands"], example.meta["operators"]
        errors = list(rng.random(len(operators)) < error_rate)
        thinking, answer = self._trace(operands, operators, errors=errors, rng=rng,
                                       error_mode=self.error_mode, redo_rate=self.redo_rate,
                                       redo_word=self.redo_word,
                                       systematic=self.systematic_error)
        thinking = self._narrate(thinking, rng)
        if self.style_marker:
            thinking = f"{self.style_marker} {thinking}"
        return self.finish_solution(example, thinking, str(answer), rng, format_error_rate)

    def _narrate(self, thinking: str, rng) -> str:
        """With mixed_script_rate > 0, each step after its word: English, or Greek with that
        probability when `rng` is given (noisy solutions; the reference stays English)."""
        if self.mixed_script_rate <= 0:
            return thinking
        steps = []
        tokens = iter(thinking.split(" "))
        for token in tokens:  # a step, with its redo if it has one
            if token == self.redo_word and steps:
                steps[-1] += f" {token} {next(tokens, '')}"
            else:
                steps.append(token)
        out = []
        for i, step in enumerate(steps):
            english, greek = STEP_WORDS[min(i, 1)]
            word = greek if rng is not None and rng.random() < self.mixed_script_rate \
                else english
            out.append(f"{word} {step}")
        return " ".join(out)
