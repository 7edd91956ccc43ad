"""grpo_jax.serve: the policy behind an OpenAI-compatible endpoint, driven by the real `openai`
client on loopback. Its answers equal `sampling.generate` on the same prompts and keys
(completions, chat, log-probs, token ids), streaming gives the non-streamed text, 16
concurrent requests give what they give one at a time, bad requests are one-line 400s, tool
calls come back as OpenAI tool_calls, and the eval mode equals the in-process rollout's
figure."""

import concurrent.futures
import json
import sys

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from grpo_jax import models, tasks  # noqa: E402
from grpo_jax.runner.prompts import prompt_of  # noqa: E402
from grpo_jax.sampling import SamplingConfig, generate, pad_prompts  # noqa: E402
from grpo_jax.serve import (Completion, Engine, ServedPolicy, ServerThread,  # noqa: E402
                            served_model)
from grpo_jax.text import CharTokenizer, prompt_ids  # noqa: E402
from grpo_jax.text.chat import MINIATURE, render_chat  # noqa: E402
from grpo_jax.tools.calls import call_text  # noqa: E402

MODEL = "tiny"
CONFIG = ml_collections.ConfigDict({"task": {"template": "plain"}, "stages": ""})


@pytest.fixture(scope="module")
def setup():
    """A random-init one-layer tiny-1m policy with the arithmetic task's character tokenizer,
    served with 4 slots (a 16-row batch decodes in the continuous layout)."""
    task = tasks.task_of("arithmetic", {})[0]
    tokenizer = CharTokenizer.for_task(task)
    config = models.named_config("tiny-1m", num_layers=1, vocab_size=tokenizer.vocab_size,
                                 max_seq_len=64)
    model = models.Transformer(config, rngs=nnx.Rngs(0))
    served = served_model(model, tokenizer, name=MODEL,
                          prompt_of_question=lambda q: prompt_of(CONFIG, task, tokenizer, q))
    engine = Engine(served, max_rows=16, slots=4, batch_wait_s=0.05)
    with ServerThread(engine) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        yield task, tokenizer, model, server, client


def _generate(model, tokenizer, ids, rows, key, max_new_tokens, **sampling):
    """The library's `generate` of `rows` copies of one prompt: (tokens, logp) per row,
    cut after EOS."""
    graphdef, state = nnx.split(model)
    tokens, mask = pad_prompts([ids] * rows, len(ids), pad_id=tokenizer.pad_id)
    out = generate(graphdef, state, tokens, mask, key, config=SamplingConfig(
        max_new_tokens=max_new_tokens, eos_ids=tuple(tokenizer.eos_ids),
        pad_id=tokenizer.pad_id, **sampling))
    lengths = np.asarray(out.lengths)
    return [(np.asarray(out.tokens)[r, :lengths[r]].tolist(),
             np.asarray(out.logp)[r, :lengths[r]]) for r in range(rows)]


def test_completions_equal_generate_with_the_request_seed(setup):
    """n = 3 completions at temperature 0.8, top_p 0.9, seed 5: the tokens, log-probs and
    text of generate's three rows with key(5); the server's batch pads the 3 rows to 4 and
    its completion buffer to 16 columns, cut at max_tokens 12."""
    _, tokenizer, model, _, client = setup
    response = client.completions.create(
        model=MODEL, prompt="Q: 12+7\nA: ", max_tokens=12, n=3, seed=5, temperature=0.8,
        top_p=0.9, logprobs=0, extra_body={"return_token_ids": True})
    ids = prompt_ids(tokenizer, "Q: 12+7\nA: ")
    expected = _generate(model, tokenizer, ids, 3, jax.random.key(5), 12, temperature=0.8,
                         top_p=0.9)
    assert response.seed == 5 and len(response.choices) == 3
    for choice, (tokens, logp) in zip(response.choices, expected):
        assert choice.token_ids == tokens and choice.prompt_token_ids == ids
        assert choice.text == tokenizer.decode(tokens)
        np.testing.assert_allclose(choice.logprobs.token_logprobs, logp, rtol=1e-4, atol=1e-5)
        assert "".join(choice.logprobs.tokens) == choice.text
        assert choice.finish_reason == ("stop" if tokens[-1] in tokenizer.eos_ids
                                        else "length")
    assert len({tuple(c.token_ids) for c in response.choices}) == 3  # three different rows
    assert response.usage.completion_tokens == sum(len(t) for t, _ in expected)


def test_chat_greedy_equals_generate_and_streams_the_same_text(setup):
    """A chat of one user message is the run's own prompt (task.template plain) decoded
    greedily; `stream: true` sends the same text token by token, with the same ids."""
    task, tokenizer, model, _, client = setup
    messages = [{"role": "user", "content": "3*4"}]
    response = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True,
        extra_body={"return_token_ids": True})
    ids = prompt_ids(tokenizer, prompt_of(CONFIG, task, tokenizer, "3*4"))
    assert tokenizer.decode(ids) == "Q: 3*4\nA: "
    ((tokens, logp),) = _generate(model, tokenizer, ids, 1, jax.random.key(0), 16,
                                  greedy=True)
    choice = response.choices[0]
    assert choice.prompt_token_ids == ids and choice.token_ids == tokens
    assert choice.message.content == tokenizer.decode(tokens) and choice.message.role == \
        "assistant"
    np.testing.assert_allclose([c.logprob for c in choice.logprobs.content], logp,
                               rtol=1e-4, atol=1e-5)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True,
        extra_body={"return_token_ids": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == choice.message.content
    assert [t for c in chunks for t in (c.choices[0].model_extra.get("token_ids") or [])] \
        == tokens
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    # a stop string ends the text before it (its tokens through the one completing it)
    stop = choice.message.content[3:5]
    cut = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                         temperature=0, stop=[stop])
    assert cut.choices[0].message.content == choice.message.content[
        :choice.message.content.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_sixteen_concurrent_requests_return_what_they_return_one_at_a_time(setup):
    """16 requests with their own prompts and seeds, sent at once, are sampled in one batch
    (16 rows over 4 slots) and each returns the tokens it returns alone."""
    _, _, _, server, client = setup

    def ask(i):
        return client.completions.create(
            model=MODEL, prompt=f"Q: {i}+{2 * i}\nA: ", max_tokens=8 + i % 5, seed=100 + i,
            extra_body={"return_token_ids": True}).choices[0].token_ids

    alone = [ask(i) for i in range(16)]
    before = len(server.engine.batches)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert together == alone
    assert max(server.engine.batches[before:]) > 1  # batched, not one at a time
    assert all(len(t) <= 8 + i % 5 for i, t in enumerate(together))


@pytest.mark.parametrize("endpoint, body, field", [
    ("completions", {"model": "other", "prompt": "Q: 1\nA: "}, "model: 'other'"),
    ("completions", {"model": MODEL, "prompt": "Q: 1\nA: ", "max_tokens": 0}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "1" * 80}, "prompt"),
    ("completions", {"model": MODEL, "prompt": "Q: 1\nA: ", "max_tokens": 60},
     "max_tokens: the prompt's"),
    ("completions", {"model": MODEL, "prompt": "Q", "temperature": -1}, "temperature"),
    ("completions", {"model": MODEL, "prompt": "Q", "temperature": 1e-6}, "temperature"),
    ("completions", {"model": MODEL, "prompt": "Q", "logprobs": 3}, "logprobs"),
    ("completions", {"model": MODEL, "prompt": "Q", "echo": True}, "echo"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x" * 70}]},
     "messages"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "1"}] * 2},
     "messages: the model has no chat template"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "bot", "content": "1"}]},
     "messages[0]"),
])
def test_bad_requests_are_one_line_400s_naming_the_field(setup, endpoint, body, field):
    client = setup[4]
    with pytest.raises(openai.BadRequestError) as caught:
        client.post(f"/{endpoint}", body=body, cast_to=object)
    message = caught.value.body["message"]
    assert caught.value.status_code == 400 and message.startswith(field)
    assert "\n" not in message


class _Scripted(Engine):
    """An engine whose completions are the given texts (their tokens, log-prob -1 each),
    recording the prompts it was given."""

    def __init__(self, served, texts):
        super().__init__(served, batch_wait_s=0)
        self.texts, self.prompts = texts, []

    def sample(self, requests):
        tokenizer = self.served.tokenizer
        self.prompts += [tokenizer.decode(r.prompt_ids) for r in requests]
        return [[Completion(tokenizer.encode(text), [-1.0] * len(tokenizer.encode(text)), False)
                 for text in self.texts[:r.n]] for r in requests]


def test_chat_tools_use_the_chat_template_and_return_tool_calls(setup):
    """With a chat template (the miniature one) the conversation, the tools and an earlier
    call are rendered by it as the trainer renders them; a completion's call in the
    checkpoint's JSON format comes back as an OpenAI tool call, its text ending at the
    call's closing tag."""
    tokenizer = CharTokenizer()
    tokenizer.chat_template = MINIATURE
    call = call_text("calc", {"expression": "3*9"})
    engine = _Scripted(ServedPolicy(MODEL, tokenizer, graphdef=None, state=None, context=512),
                       [f"ok {call} and more", "27"])
    tools = [{"type": "function", "function": {
        "name": "calc", "description": "arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}}]
    history = [{"role": "user", "content": "3*9?"},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "calc", "arguments": '{"expression": "3*9"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "27"}]
    with ServerThread(engine) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        response = client.chat.completions.create(model=MODEL, messages=history, tools=tools,
                                                  n=2, max_tokens=40)
    assert engine.prompts == [render_chat(MINIATURE, [
        history[0], {"role": "assistant", "content": call},
        {"role": "tool", "content": "27"}], tools=tools)]
    first, second = response.choices
    assert first.finish_reason == "tool_calls" and first.message.content == "ok "
    (tool_call,) = first.message.tool_calls
    assert tool_call.function.name == "calc"
    assert json.loads(tool_call.function.arguments) == {"expression": "3*9"}
    assert second.message.content == "27" and second.message.tool_calls is None


def test_the_eval_mode_equals_the_in_process_rollout(setup):
    """8 held-out arithmetic problems scored through the endpoint (greedy, one user message
    each) give the texts and the pass@1 of the library's own rollout (`rl.rollout`:
    the run's prompts, greedy `generate`, the task's accuracy reward)."""
    from grpo_jax.evals.metrics import solved
    from grpo_jax.rl.rollout import launch_rollout
    from grpo_jax.serve.eval import main as eval_main
    from grpo_jax.serve.eval import score_endpoint
    from grpo_jax.training import Policy

    task, tokenizer, model, server, _ = setup
    examples = task.examples("test", 8, seed=0)
    figures = score_endpoint(server.base_url, task, examples, max_tokens=16)
    policy, params = Policy.from_model(model)
    rollout = launch_rollout(
        policy, params, tokenizer, examples,
        [prompt_of(CONFIG, task, tokenizer, ex) for ex in examples], jax.random.key(0),
        sampling=SamplingConfig(max_new_tokens=16, greedy=True,
                                eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id),
        prompt_len=32, reward_fns={"accuracy": task.reward_fns()["accuracy"]},
        weights={"accuracy": 1.0})()
    assert figures["texts"] == list(rollout.texts)
    accuracy = np.asarray(rollout.components["accuracy"])
    assert figures["pass@1"] == float(np.mean(solved(accuracy)))
    assert figures["reward/accuracy"] == pytest.approx(float(accuracy.mean()))
    assert figures["num_problems"] == 8
    assert eval_main(["--base-url", server.base_url, "--task", "arithmetic", "--n", "0"]) == 2


def test_an_exported_checkpoint_is_served_with_its_tokenizer_and_chat_template(tmp_path,
                                                                             capsys):
    """`load_policy` on a Hugging Face checkpoint directory (what `grpo_jax.export` writes):
    its tokenizer.json (multi-character tokens whose pieces join to the text), its chat
    template, its context; a greedy completion equals generate's on the loaded model. A
    folder without tokenizer.json, or no folder, is a one-line error of the command."""
    from grpo_jax.models import ModelConfig, Transformer, from_pretrained, save_pretrained
    from grpo_jax.serve import load_policy
    from grpo_jax.serve.__main__ import main as serve_main
    from grpo_jax.serve.app import finished_text
    from grpo_jax.serve.engine import Request, Settings
    from tests.test_hf_tokenizer import build

    build(tmp_path)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    settings["chat_template"] = MINIATURE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    config = ModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=16, mlp_size=64, max_seq_len=96)
    save_pretrained(Transformer(config, rngs=nnx.Rngs(1)), config, tmp_path)
    served = load_policy(str(tmp_path), name="export")
    assert served.context == 96 and served.chat_template == MINIATURE
    ids = prompt_ids(served.tokenizer, "the answer is")
    engine = Engine(served, slots=4, batch_wait_s=0)
    try:
        (completion,) = engine.sample([Request(ids, 1, 16, Settings(temperature=0), 0)])[0]
    finally:
        engine.close()
    model, _ = from_pretrained(tmp_path)
    ((tokens, _),) = _generate(model, served.tokenizer, ids, 1, jax.random.key(0), 16,
                               greedy=True)
    assert completion.tokens == tokens
    text, _, _, pieces, _ = finished_text(served.tokenizer, completion)
    assert "".join(pieces) == text == served.tokenizer.decode(tokens)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        load_policy(str(tmp_path))
    capsys.readouterr()
    assert serve_main([f"--workdir={tmp_path / 'nowhere'}", "--port=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --workdir: ") and "is not a directory" in line


def test_a_missing_web_stack_is_one_line_naming_the_extra(monkeypatch, capsys):
    from grpo_jax.serve.__main__ import main as serve_main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises
    assert serve_main(["--workdir=.", "--port=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == 'error: the server needs fastapi and uvicorn: pip install -e ".[serve]"'


class _Failing(Engine):
    def sample(self, requests):
        raise FloatingPointError("non-finite logits\nin 1 of 1 rows")


def test_a_sampler_failure_is_a_one_line_500_and_the_server_goes_on():
    engine = _Failing(ServedPolicy(MODEL, CharTokenizer(), graphdef=None, state=None,
                                   context=64), batch_wait_s=0)
    with ServerThread(engine) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as caught:
                client.completions.create(model=MODEL, prompt="Q", max_tokens=4)
            assert caught.value.body["message"] == (
                "the sampler failed: FloatingPointError: non-finite logits in 1 of 1 rows")


def test_a_run_directory_is_served_with_its_final_policy_and_prompt(tmp_path):
    """`load_policy` on a run directory (or its checkpoints/ folder): the final checkpoint's
    parameters (`FinishedRun.policy`), the run's tokenizer and its own prompt for a question
    (the smoke job's task.template plain), named after the folder."""
    from grpo_jax import api
    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.runner.inputs import build_task
    from grpo_jax.runner.model_init import build_model
    from grpo_jax.runner.tokenizers import build_tokenizer
    from grpo_jax.serve import load_policy

    workdir = tmp_path / "my_run"
    workdir.mkdir()
    config = api.config("smoke")
    config.model.num_layers, config.stages = 1, "pretrain"
    tokenizer = build_tokenizer(config, build_task(config), str(workdir))
    _, model = build_model(config, tokenizer)
    # parameters no fresh initialisation has: the served ones are the checkpoint's
    trained = jax.tree.map(lambda x: x + 0.5, nnx.to_pure_dict(nnx.state(model)))
    (workdir / "config.json").write_text(json.dumps(config.to_dict()))
    with Checkpointer(workdir / "checkpoints", async_=False) as checkpointer:
        checkpointer.save(1, state={"params": trained, "rng": jax.random.key(0)},
                          meta={"stage": "pretrain", "stage_done": True, "global_step": 1})
    served = load_policy(str(workdir / "checkpoints"))
    assert served.name == "my_run" and served.context == config.model.max_seq_len
    assert served.prompt_of_question("3+4") == "Q: 3+4\nA: "
    assert served.tokenizer.encode("Q: 3+4") == tokenizer.encode("Q: 3+4")
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 nnx.to_pure_dict(served.state), trained)
