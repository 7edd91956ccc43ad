"""The calculator tool against exact arithmetic and hostile calls, and tool calls in text."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from grpo_jax.tools import (answer, calculate, call_tool, evaluate, find_call,
                            render_observation)


@pytest.mark.parametrize("expression,expected", [
    ("3 * (4 + 5)", "27"),
    ("3 * (4 + 5) / 6", "9/2"),
    ("1/3 + 1/6", "1/2"),
    ("-7 // 2", "-4"),
    ("-7 % 3", "2"),
    ("2 ** 10 - 1", "1023"),
    ("2 ** -2", "1/4"),
    ("0.1 + 0.2", "3/10"),  # exactly, not 0.30000000000000004
    ("(12345 * 6789)", str(12345 * 6789)),
    (" +-+5 ", "-5"),
])
def test_exact_values(expression, expected):
    assert calculate(expression) == expected


def test_agrees_with_fractions_on_random_expressions():
    import random

    rng = random.Random(0)
    for _ in range(200):
        a, b, c = (rng.randint(-999, 999) for _ in range(3))
        d = rng.randint(1, 99)
        expression = f"({a} + {b}) * {c} / {d} - {a} % {d}"
        assert evaluate(expression) == (Fraction(a + b) * c / d - (a % d))


@pytest.mark.parametrize("expression,needle", [
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("__import__('os').system('true')", "unsupported syntax"),
    ("open('/etc/passwd').read()", "unsupported syntax"),
    ("x + 1", "unsupported syntax"),
    ("(1).__class__", "unsupported syntax"),
    ("[1, 2][0]", "unsupported syntax"),
    ("1 if 1 else 2", "unsupported syntax"),
    ("lambda: 1", "unsupported syntax"),
    ("'a' * 3", "unsupported literal"),
    ("True + 1", "unsupported literal"),
    ("1 < 2", "unsupported syntax"),
    ("9 ** 9 ** 9", "exponent is larger"),
    ("99999999 ** 999", "more than 2048 bits"),
    ("2 ** 0.5", "whole-number exponents"),
    ("1" * 300, "longer than 256 characters"),
    ("1+(" * 30 + "1" + ")" * 30, "nested more than"),
    ("+".join(["1"] * 100), "more than 128 parts"),
    ("1e400", "unsupported literal"),
    ("3 +", "not an arithmetic expression"),
    ("", "empty expression"),
])
def test_hostile_calls_are_one_line_errors_and_fast(expression, needle):
    start = time.perf_counter()
    out = calculate(expression)
    assert out.startswith("error: ") and needle in out and "\n" not in out, out
    assert time.perf_counter() - start < 0.5  # capped before it is computed


def test_calls_in_text_and_their_observations():
    text = "Compute: <calc>12*34</calc> and more <calc>1/0</calc>"
    call = find_call(text)
    assert (call.name, call.argument) == ("calc", "12*34")
    assert text[:call.end].endswith("</calc>")
    assert call_tool(call.name, call.argument) == "408"
    assert render_observation("408") == "<result>408</result>"
    assert find_call("no call <calc>1+1") is None  # not closed yet
    assert find_call("<shell>1</shell>") is None  # not a known tool


def test_a_tool_never_crashes_or_stalls_the_caller():
    def slow(_):
        time.sleep(2)
        return "late"

    def broken(_):
        raise RuntimeError("boom")

    tools = {"slow": slow, "broken": broken, "big": lambda _: "x" * 1000,
             "wrong": lambda _: 42}
    start = time.perf_counter()
    assert call_tool("slow", "", tools=tools, deadline_seconds=0.1) == \
        "error: no answer within 0.1 s"
    assert time.perf_counter() - start < 1.0
    assert call_tool("broken", "", tools=tools) == "error: RuntimeError"
    assert call_tool("big", "", tools=tools) == "error: output longer than 200 characters"
    assert call_tool("wrong", "", tools=tools) == "error: the tool returned no text"
    assert call_tool("nope", "", tools=tools) == "error: unknown tool 'nope'"


def test_the_environment_answers_the_last_call_of_a_turn():
    assert answer("I need 12*34: <calc>12*34</calc>") == "<result>408</result>"
    assert answer("<calc>1+1</calc> then <calc>2**5</calc>") == "<result>32</result>"
    assert answer("<calc>1/0</calc>") == "<result>error: division by zero</result>"
    assert answer("no call at all</calc>") == "<result>error: no complete tool call</result>"


def test_each_tool_is_one_record_that_its_environments_read():
    """The table's record is what a tag call's environment (stop text, parallel steps, error
    prefixes) and JSON calls (schema, state) read; the sampler reads an environment's
    declared attributes, never probing it with getattr."""
    import pathlib

    from grpo_jax.sampling import episodes
    from grpo_jax.tools import (TABLE, TOOLS, Environment, JsonToolEnvironment,
                                ToolEnvironment, as_environment, make_environment)

    assert set(TOOLS) == {name for name, tool in TABLE.items() if not tool.stateful}
    for name, fn in TOOLS.items():
        tool, environment = TABLE[name], make_environment(name)
        assert isinstance(environment, ToolEnvironment) and fn is tool.fn
        assert environment.stop_text == tool.stop == f"</{name}>"
        assert environment.parallel_steps == tool.parallel_steps
        assert all(environment.is_error(f"<result>{p} x</result>") for p in tool.error_prefixes)
        assert not environment.is_error("<result>27</result>")
    for name, tool in TABLE.items():
        if tool.stateful:
            assert tool.game(feedback=True, render=render_observation).stop_text == tool.stop
    json_tools = JsonToolEnvironment(tools=tuple(TABLE))
    assert json_tools.schemas == [TABLE[name].schema for name in TABLE]
    assert json_tools.gives_rewards == any(tool.stateful for tool in TABLE.values())
    assert json_tools.parallel_steps == max(tool.parallel_steps for tool in TABLE.values())
    # A plain function of the turn's text is an Environment with the defaults declared.
    adapted = as_environment(lambda text: text)
    assert isinstance(adapted, Environment) and adapted.step(7, "x") == ("x", 0.0, False, 7)
    assert (adapted.parallel_steps, adapted.render, adapted.is_error("error: x")) == (1, None,
                                                                                      False)
    assert "getattr(" not in pathlib.Path(episodes.__file__).read_text()
