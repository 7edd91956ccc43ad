"""Write a Python expression from input/output examples; the reward runs it on hidden tests
in the sandbox (`tools.sandbox`).

Problem: three examples of a hidden function of x, e.g. "f(1)=5 f(2)=7 f(4)=11"; the answer
is a Python expression in x, e.g. `<answer>2*x+3</answer>`. The hidden functions are drawn
from a few shapes (difficulty 1: a*x+b; 2: also x*x+b and a*(x+b); 3: also x%a+b and
a*x*x+b), small integer constants (a in 2..5, b in 0..`max_constant`, 9 by default). The
reward "tests" is the fraction of six hidden tests (other inputs) the expression passes,
each answer run in its own sandbox process (the expression is never evaluated in the
trainer); "accuracy" is 1 when it passes them all.

Worked solutions state the shape in the thinking and the expression in the answer; noisy
ones get one constant wrong with probability `error_rate`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json

import numpy as np

from grpo_jax.rewards.parsing import extract_answer
from grpo_jax.tasks.base import Example, Task, check_rate
from grpo_jax.tasks.registry import register_task
from grpo_jax.tasks.templates import format_completion
from grpo_jax.tools.sandbox import run_python

# difficulty -> the shapes it draws from: (name, the expression with {a} and {b})
_SHAPES = {1: (("linear", "{a}*x+{b}"),),
           2: (("square", "x*x+{b}"), ("scaled", "{a}*(x+{b})")),
           3: (("modulo", "x%{a}+{b}"), ("quadratic", "{a}*x*x+{b}"))}
SHOWN, HIDDEN = (1, 2, 4), (0, 3, 5, 6, 7, 9)
MAX_EXPRESSION_CHARS = 64
MAX_CONSTANT = 9  # the default largest b: the problems drawn before the keyword existed
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpo_tests")


def shapes_of(difficulty: int):
    return tuple(shape for level in range(1, difficulty + 1) for shape in _SHAPES.get(level, ()))


def evaluate_expression(expression: str, inputs) -> list:
    """The values of `expression` at `inputs`, computed in the sandbox; None where it fails
    (or everywhere when the expression is too long or the program stops)."""
    if not expression or len(expression) > MAX_EXPRESSION_CHARS or "\n" in expression:
        return [None] * len(inputs)
    program = ("import json\nout = []\n"
               f"for x in {list(inputs)!r}:\n"
               "    try:\n"
               f"        v = ({expression})\n"
               "        out.append(v if isinstance(v, int) and not isinstance(v, bool) "
               "and abs(v) < 10 ** 12 else None)\n"
               "    except Exception:\n"
               "        out.append(None)\n"
               "print(json.dumps(out))\n")
    result = run_python(program, deadline_seconds=1.0, max_output_chars=400)
    if result.stopped is not None:
        return [None] * len(inputs)
    try:
        values = json.loads(result.output)
    except json.JSONDecodeError:
        return [None] * len(inputs)
    return values if isinstance(values, list) and len(values) == len(inputs) \
        else [None] * len(inputs)


@functools.cache
def _compiled(expression: str):
    """x -> the value of `expression`, one of the task's own patterns (never a policy's
    text): compiled once per expression (a few hundred exist), evaluated per x."""
    code = compile(expression, "<code_expression>", "eval")
    return lambda x: eval(code, {"__builtins__": {}}, {"x": x})  # our own grammar


@register_task("code_expression")
class CodeExpressionTask(Task):
    """Program synthesis in miniature: a Python expression in x from three examples."""

    name = "code_expression"
    characters = "%"

    def __init__(self, difficulty=(1, 2), *, max_constant: int = MAX_CONSTANT):
        """Args: difficulty (int or list); max_constant: the largest additive constant b
        (drawn from 0..max_constant; the default draws every problem it drew before the
        keyword existed; a larger one gives more distinct problems, so a larger held-out
        split, and numbers of more digits in the prompts)."""
        super().__init__(difficulty)
        if isinstance(max_constant, bool) or not isinstance(max_constant, int) \
                or max_constant < 1:
            raise ValueError(f"max_constant: expected an integer >= 1, got {max_constant!r}")
        self.max_constant = max_constant
        self._passed: dict[tuple[str, str], float] = {}  # (expression, problem) -> fraction

    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        shapes = shapes_of(difficulty)
        name, pattern = shapes[int(rng.integers(len(shapes)))]
        a = int(rng.integers(2, 6))
        b = int(rng.integers(0, self.max_constant + 1))
        expression = pattern.format(a=a, b=b)
        function = _compiled(expression)
        values = {x: function(x) for x in SHOWN + HIDDEN}
        prompt = " ".join(f"f({x})={values[x]}" for x in SHOWN)
        return Example(id=f"code_expression:{expression}", prompt=prompt, answer=expression,
                       solution=format_completion(name, expression), difficulty=difficulty,
                       meta={"tests": [[x, values[x]] for x in HIDDEN], "shape": name,
                             "a": a, "b": b})

    def solution(self, example: Example, *, rng, error_rate: float,
                 format_error_rate: float = 0.0) -> tuple[str, bool]:
        """A worked solution; with probability `error_rate` a constant is off by one."""
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        expression = example.answer
        if rng.random() < error_rate:
            constant = str(example.meta["b"])
            expression = expression[::-1].replace(constant[::-1],
                                                  str(example.meta["b"] + 1)[::-1], 1)[::-1]
        text = format_completion(example.meta["shape"], expression)
        if rng.random() < format_error_rate:
            text = text.replace("</answer>", "")
        return text, expression == example.answer

    def tests_passed(self, completion: str, example: Example) -> float:
        """The fraction of the hidden tests the answer's expression passes (in the sandbox)."""
        return self.batched_tests([completion], [example])[0]

    def batched_tests(self, completions, examples) -> np.ndarray:
        """`tests_passed` of many completions, their sandboxes run four at a time."""
        def one(pair):
            completion, example = pair
            expression = (extract_answer(completion) or "").strip()
            key = (expression, example.id)
            if key not in self._passed:  # "tests" and "accuracy" share one run
                tests = example.meta["tests"]
                got = evaluate_expression(expression, [x for x, _ in tests])
                if len(self._passed) >= 8192:
                    self._passed.clear()
                self._passed[key] = sum(v == y for v, (_, y) in zip(got, tests)) / len(tests)
            return self._passed[key]

        return np.asarray(list(_POOL.map(one, zip(completions, examples))), np.float32)

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.tests_passed(completion, example) == 1.0

    def reward_fns(self):
        """The base rewards (format, ...), "accuracy" (every hidden test passes) and "tests"
        (the fraction passed); both run the sandbox, batched."""
        fns = dict(super().reward_fns())

        def tests(completion, example):
            return self.tests_passed(completion, example)

        tests.batched = self.batched_tests

        def accuracy(completion, example):
            return float(self.tests_passed(completion, example) == 1.0)

        accuracy.batched = lambda cs, exs: (self.batched_tests(cs, exs) == 1.0).astype(np.float32)
        return {**fns, "accuracy": accuracy, "tests": tests}
