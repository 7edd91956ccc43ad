"""Tool calls in the checkpoint's format (`tools.calls`): JSON calls parsed by hand, parse
failures answered and counted, answers cut on a token boundary with their closing tag kept,
and a round trip through a real tokenizer directory's chat template (tools described in the
prompt, the call's closing tag found on token ids wherever BPE merges, parsed, answered in
the tool role)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from grpo_jax.sampling.episodes import answer_ids
from grpo_jax.text import CharTokenizer
from grpo_jax.tools import make_environment
from grpo_jax.tools.calls import (CLOSE, OPEN, JsonToolEnvironment, ToolCallError, call_text,
                                  parse_call, schema)
from grpo_jax.tools.base import render_observation

TOOLS = ("calc", "python")


@pytest.mark.parametrize("text,expected", [
    (call_text("calc", {"expression": "3*9"}), ("calc", "3*9")),
    ('so <tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}'
     '</tool_call>', ("python", "print(1)")),  # arguments as a JSON string
    (call_text("calc", {"expression": "1"}) + call_text("calc", {"expression": "2"}),
     ("calc", "2")),  # the last call of the turn
])
def test_calls_parse(text, expected):
    assert parse_call(text, TOOLS) == expected


@pytest.mark.parametrize("text,reason", [
    ("no call here", "no <tool_call>"),
    (f"{OPEN}{{'name': 'calc'}}{CLOSE}", "not JSON"),
    (f"{OPEN}[1, 2]{CLOSE}", "not a JSON object"),
    (call_text("shell", {"cmd": "ls"}), "unknown tool 'shell'"),
    (call_text("calc", {"expr": "1+1"}), 'calc needs arguments {"expression": string}'),
    (f'{OPEN}{{"name": "calc", "arguments": "1+1"}}{CLOSE}', "not a JSON object"),
])
def test_malformed_calls_say_why(text, reason):
    with pytest.raises(ToolCallError, match=reason.replace("{", r"\{").replace("[", r"\[")):
        parse_call(text, TOOLS)


@pytest.mark.parametrize("payload,reason", [
    ("[" * 995 + "]" * 995, "not JSON (nested too deeply)"),
    ("[" * 100_000, "not JSON (nested too deeply)"),
    ('{"name": "calc", "arguments": {"expression": ' + "1" * 4301 + "}}",
     "not JSON (ValueError: Exceeds the limit (4300 digits) for integer string conversion)"),
    ('{"name": "calc", "arguments": "{\\"expression\\": ' + "1" * 4301 + '}"}',
     "arguments is a string that is not a JSON object"),
])
def test_calls_past_the_json_parsers_limits_are_parse_failures(payload, reason):
    """Nesting past the recursion limit (RecursionError) and an integer past Python's digit
    limit (ValueError) are calls that do not parse, answered and counted like the others."""
    with pytest.raises(ToolCallError) as error:
        parse_call(OPEN + payload + CLOSE, TOOLS)
    assert str(error.value) == reason
    environment = JsonToolEnvironment(tools=TOOLS)
    answer = environment(OPEN + payload + CLOSE)
    assert answer == f"<result>error: tool call not parsed: {reason}</result>"
    assert environment.is_parse_failure(answer)


def test_the_environment_answers_and_counts_parse_failures():
    environment = make_environment("json:calc,python")
    assert isinstance(environment, JsonToolEnvironment) and environment.tools == TOOLS
    assert environment.stop_text == CLOSE
    assert [s["function"]["name"] for s in environment.schemas] == ["calc", "python"]
    assert environment(call_text("calc", {"expression": "3*9"})) == "<result>27</result>"
    ran = environment(call_text("python", {"code": "print(sum(range(5)))"}))
    assert ran == "<result>10\n</result>" and not environment.is_error(ran)
    broken = environment(f"{OPEN}{{not json}}{CLOSE}")
    assert broken.startswith("<result>error: tool call not parsed: not JSON")
    assert environment.is_parse_failure(broken) and environment.is_error(broken)
    blocked = environment(call_text("python", {"code": "import socket"}))
    assert environment.is_error(blocked) and not environment.is_parse_failure(blocked)
    with pytest.raises(ValueError, match="JSON calls take tools of"):
        JsonToolEnvironment(tools=("shell",))
    with pytest.raises(ValueError, match="unknown tool or environment 'json:shell'"):
        make_environment("json:shell")


def test_a_long_answer_is_cut_inside_and_keeps_its_closing_tag():
    tokenizer = CharTokenizer(tags=("<result>", "</result>"))
    text = render_observation("1234567890" * 3)
    ids = answer_ids(text, tokenizer, 8, render_observation)
    assert len(ids) == 8 and tokenizer.decode(ids) == "<result>123456</result>"
    assert answer_ids(render_observation("12"), tokenizer, 8, render_observation) == \
        list(tokenizer.encode("<result>12</result>"))
    assert tokenizer.decode(answer_ids("no wrapper here", tokenizer, 4)) == "no w"


# A Qwen2.5-style template: tools described in the system turn, calls in <tool_call> tags,
# answers in a user turn's <tool_response>.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call functions. Signatures:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\nReturn a call as "
    "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ '<|im_start|>user\n"
    "<tool_response>\n' + m['content'] + '\n</tool_response><|im_end|>\n' }}{% else %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _tool_tokenizer(directory):
    """A byte-level BPE tokenizer.json whose <tool_call> tags are added tokens (as in
    Qwen2.5's), with the template above."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ['{"name": "calc", "arguments": {"expression": "3*9"}}', "tool_call response",
              "system user assistant functions"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>",
                                                                  "<|im_start|>",
                                                                  "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": TOOL_TEMPLATE}, f)


def test_a_json_call_round_trips_through_a_checkpoint_chat_template(tmp_path):
    from grpo_jax.text import HFTokenizer

    _tool_tokenizer(tmp_path)
    tokenizer = HFTokenizer(tmp_path)
    environment = make_environment("json:calc", render=tokenizer.tool_response_renderer())
    # render: the tools are described in the prompt
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "3*9?"}],
                                           tools=environment.schemas)
    assert json.dumps(schema("calc")) in prompt and prompt.endswith("<|im_start|>assistant\n")
    # generate: the policy's turn as one token stream; the closing tag is one id wherever
    # the text around it merges, so the sampler's stop sequence is its tail
    stop = tokenizer.encode(environment.stop_text)
    assert len(stop) == 1
    for before in ("", "x", "}}", " ok"):
        turn = before + call_text("calc", {"expression": "3*9"})
        ids = tokenizer.encode(prompt + turn)
        assert ids[-1:] == stop, before
        # parse: the decoded turn keeps its tags (added tokens, not specials)
        text = tokenizer.decode(tokenizer.encode(turn))
        assert parse_call(text, environment.tools) == ("calc", "3*9")
    # answer: in the template's tool turn, cut inside with its closing text kept
    answer = environment(turn)
    assert answer == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n27\n</tool_response>"
                      "<|im_end|>\n<|im_start|>assistant\n")
    full = answer_ids(answer, tokenizer, 64, environment.render)
    assert tokenizer.decode(full) == tokenizer.decode(tokenizer.encode(answer))
    long = environment.render("9" * 200)
    cut = answer_ids(long, tokenizer, 24, environment.render)
    assert len(cut) <= 24 and np.array_equal(cut[-len(tokenizer.encode(answer.split("27")[1])):],
                                             tokenizer.encode(answer.split("27")[1]))


def test_the_guessing_game_as_a_json_tool_keeps_its_state_beside_python():
    """`json:guess,python`: guesses are calls of a tool with state (the game's reward and
    end), python calls are answered from the call alone, parse failures are counted."""
    from grpo_jax.tasks.base import Example

    environment = make_environment("json:guess,python")
    assert environment.gives_rewards and environment.parallel_steps == 4
    assert [s["function"]["name"] for s in environment.schemas] == ["guess", "python"]
    observation, state = environment.reset(Example(id="g", prompt="1-8", answer="6"))
    assert observation == ""
    said, reward, done, state = environment.step(state, call_text("guess", {"number": "4"}))
    assert (said, reward, done) == ("<result>higher</result>", 0.0, False)
    ran, reward, done, same = environment.step(state, call_text("python",
                                                                {"code": "print((5+8+1)//2)"}))
    assert (ran, reward, done) == ("<result>7\n</result>", 0.0, False) and same == state
    broken, reward, done, same = environment.step(state, f"{OPEN}{{'name'}}{CLOSE}")
    assert environment.is_parse_failure(broken) and not done and same == state
    said, reward, done, state = environment.step(state, call_text("guess", {"number": "x"}))
    assert said == "<result>error: no guess</result>" and not done
    said, reward, done, state = environment.step(state, call_text("guess", {"number": "6"}))
    assert (said, reward, done) == ("", 1.0, True) and state.guesses == (4, 6)
    with pytest.raises(TypeError, match="step"):
        environment(call_text("guess", {"number": "6"}))
    blind = JsonToolEnvironment(tools=("guess",), feedback=False)
    _, state = blind.reset(Example(id="g", prompt="1-8", answer="6"))
    assert blind.step(state, call_text("guess", {"number": "4"}))[0] == "<result>no</result>"


def test_the_miniature_template_writes_the_json_traces_of_the_guessing_task():
    """The miniature chat template renders the task's prompt with its tools, and a
    conversation of calls and tool answers as exactly the task's worked solution: the
    traces the model is pretrained on are the episodes' text."""
    from grpo_jax.tasks.guess_number import GuessNumberTask, guesses_in
    from grpo_jax.text.chat import MINIATURE, render_chat

    task = GuessNumberTask(calls="json", python_rate=1.0)
    environment = make_environment("json:guess,python")
    example = task.examples("train", 1, seed=3)[0]
    low, high = example.meta["low"], example.meta["high"]
    first = (low + high + 1) // 2
    assert example.solution.startswith(call_text("python", {"code": f"print(({low}+{high}+1)"
                                                                     f"//2)"}))
    prompt = render_chat(MINIATURE, [{"role": "user", "content": example.prompt}],
                         tools=environment.schemas)
    assert prompt == f"<tools>guess(number) python(code)</tools>\n{example.prompt}\n"
    # replay the worked solution against the environment, turn by turn
    renderer = CharTokenizer()
    renderer.chat_template = MINIATURE
    render = renderer.tool_response_renderer()
    assert render("x") == task.render_answer("x") == "<tool_response>x</tool_response>"
    env = dataclasses.replace(environment, render=render)
    _, state = env.reset(example)
    messages, rest = [{"role": "user", "content": example.prompt}], example.solution
    while rest:
        turn, rest = rest.split(CLOSE, 1)
        said, _, done, state = env.step(state, turn + CLOSE)
        messages.append({"role": "assistant", "content": turn + CLOSE})
        if done:
            break
        messages.append({"role": "tool", "content": said[len("<tool_response>"):
                                                          -len("</tool_response>")]})
        rest = rest[len(said):]
    assert done and not rest and guesses_in(example.solution)[0] == first
    assert render_chat(MINIATURE, messages, tools=environment.schemas) == \
        prompt + example.solution
    assert task.reward_fns()["format"](example.solution, example) == 1.0
    assert task.reward_fns()["format"](example.solution.replace('"}}', '"}', 1), example) == 0
