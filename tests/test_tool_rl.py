"""Tool calls as environment state: the tool task agrees with its environment, observation
tokens carry no gradient, GAE skips them, a checkpoint's chat template writes the tool's
turn, bad settings fail in one line, and GRPO and PPO train on multi-turn episodes (tool
calls, real gradients, exact log-prob parity) and resume mid-stage bit-exactly."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tools as tools_config
from grpo_jax import losses
from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.rl import update as update_lib
from grpo_jax.rl.rollout import Rollout, observation_texts, tool_record
from grpo_jax.runner.validation import ConfigError, validate
from grpo_jax.stages import KINDS, default_section
from grpo_jax.tasks import get_task
from grpo_jax.text import CharTokenizer
from grpo_jax.text.chat import tool_response_renderer
from grpo_jax.tools import Environment, ToolEnvironment


def test_tool_task_traces_agree_with_the_environment():
    """The clean worked solution's observation is exactly what the environment answers to
    its call; noisy traces call the tool at tool_rate and are scored honestly."""
    task = get_task("tool_arithmetic", tool_rate=0.5)
    environment = ToolEnvironment()
    tokenizer = CharTokenizer.for_task(task)
    assert all(len(tokenizer.encode(tag)) == 1 for tag in ("<calc>", "</calc>", "<result>"))
    examples = task.examples("train", 200, seed=0)
    digits = {len(ex.meta["expression"].split(op)[0]) for ex in examples for op in "+-*"
              if op in ex.meta["expression"]}
    assert digits == {3, 4, 5}
    for ex in examples[:20]:
        call_end = ex.solution.index("</calc>") + len("</calc>")
        observation = environment(ex.solution[:call_end])
        assert ex.solution[call_end:].startswith(observation)
        assert task.is_correct(ex.solution, ex) and task.correct_call(ex.solution, ex) == 1.0
    rng = np.random.default_rng(1)
    traces = [(ex, *task.solution(ex, rng=rng, error_rate=0.3, format_error_rate=0.0))
              for ex in examples]
    called = [("<calc>" in text) for _, text, _ in traces]
    assert 0.4 < np.mean(called) < 0.6
    for (ex, text, correct), call in zip(traces, called):
        assert correct == task.is_correct(text, ex)
        if not call:  # in head: no correct tool use
            assert task.correct_call(text, ex) == 0.0
    # Noise: some tool traces miscopy an operand (a wrong call) or the result.
    wrong_calls = [t for (ex, t, c), call in zip(traces, called)
                   if call and task.correct_call(t, ex) == 0.0]
    assert wrong_calls and 0.5 < np.mean([c for _, _, c in traces]) < 0.9


def test_observation_tokens_carry_no_gradient_in_the_loss_or_the_kl(monkeypatch):
    """The GRPO loss (clipped surrogate, k3 KL, entropy bonus) as a function of the
    per-token log-probs: its gradient is zero on observation slots and holes, non-zero on
    the generated tokens."""
    generated = np.array([[1, 1, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1, 1]], bool)
    observation = np.array([[0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0]], bool)
    mask = generated | observation
    b, n = mask.shape
    rng = np.random.default_rng(0)
    batch = Rollout(prompt_tokens=np.ones((b, 3), np.int32), prompt_mask=np.ones((b, 3), bool),
                    tokens=np.ones((b, n), np.int32), attention_mask=mask, loss_mask=generated,
                    behaviour_logp=np.log(rng.uniform(0.1, 0.9, (b, n))).astype(np.float32),
                    rewards=np.array([1.0, 0.0], np.float32), version=0).to_batch()
    np.testing.assert_array_equal(np.asarray(batch.loss_mask), generated)
    batch = batch.replace(advantages=jnp.asarray([[1.0], [-1.0]]) * jnp.ones((b, n)),
                          ref_logp=jnp.asarray(np.log(rng.uniform(0.1, 0.9, (b, n))),
                                               jnp.float32))

    def fake_logp(policy, params, tokens, attention_mask, prompt_len, temperature,
                  return_entropy, prompt_group):
        return params["logp"], params["entropy"]

    monkeypatch.setattr(update_lib, "sequence_logp", fake_logp)
    settings = update_lib.LossSettings(beta=0.1, entropy_coef=0.01, on_policy=False)
    params = {"logp": jnp.asarray(np.log(rng.uniform(0.1, 0.9, (b, n))), jnp.float32),
              "entropy": jnp.ones((b, n), jnp.float32)}
    batch = batch.replace(old_logp=params["logp"] + 0.05)

    def loss(params):
        return update_lib.policy_loss(params, batch, policy=None, settings=settings,
                                      prompt_len=3, num_tokens=generated.sum(),
                                      num_sequences=b)[0]

    grads = jax.grad(loss)(params)
    for name in ("logp", "entropy"):
        g = np.asarray(grads[name])
        assert np.all(g[~generated] == 0), name
        assert np.all(g[generated] != 0), name


def test_token_gae_skips_observations():
    """GAE over a row with an observation inside equals GAE over its generated tokens
    alone (the observation is the environment's transition), placed back in their slots."""
    rewards = jnp.asarray([[0.1, 0.2, 0.0, 0.0, -0.1, 1.0, 0.0]])
    values = jnp.asarray([[0.5, 0.4, 9.0, 9.0, 0.3, 0.2, 9.0]])
    mask = jnp.asarray([[True, True, False, False, True, True, False]])
    advantages, returns = losses.token_gae(rewards, values, mask, gamma=0.9, lambda_=0.8)
    keep = np.flatnonzero(np.asarray(mask[0]))
    dense_adv, dense_ret = losses.token_gae(rewards[:, keep], values[:, keep],
                                            jnp.ones((1, len(keep)), bool), gamma=0.9,
                                            lambda_=0.8)
    np.testing.assert_allclose(np.asarray(advantages)[0, keep], np.asarray(dense_adv)[0],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(returns)[0, keep], np.asarray(dense_ret)[0],
                               rtol=1e-6)
    assert np.all(np.asarray(advantages)[~np.asarray(mask)] == 0)
    # By hand, the last two tokens: A_5 = 1.0 - 0.2; A_4 = -0.1 + 0.9*0.2 - 0.3 + 0.72*A_5.
    assert float(advantages[0, 5]) == pytest.approx(0.8)
    assert float(advantages[0, 4]) == pytest.approx(-0.1 + 0.18 - 0.3 + 0.72 * 0.8)


# A template in the style of Qwen2's (a tool message is a user turn wrapping the answer in
# <tool_response> tags), and one with no tool role.
TOOL_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ '<|im_start|>user\n"
    "<tool_response>\n' + m['content'] + '\n</tool_response><|im_end|>\n' }}{% else %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
NO_TOOL_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('roles are user and assistant') }}{% endif %}"
    "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}")


def test_a_chat_template_writes_the_tool_turn():
    render = tool_response_renderer(TOOL_TEMPLATE)
    assert render("27") == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n27\n"
                            "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert tool_response_renderer(NO_TOOL_TEMPLATE) is None
    environment = ToolEnvironment(render=render)
    assert environment("<calc>3*9</calc>") == render("27")
    assert ToolEnvironment()("<calc>3*9</calc>") == "<result>27</result>"


def test_a_checkpoint_tokenizer_writes_tool_answers_in_its_chat_format(tmp_path):
    """A Hugging Face tokenizer directory: its template's tool turn wraps the answer, and
    the run's environment (`tool_episodes` with task.template=chat) uses it."""
    from grpo_jax.runner.rollouts import tool_episodes
    from grpo_jax.sampling import SamplingConfig
    from grpo_jax.text import HFTokenizer
    from tests.test_real_checkpoint import _write_tokenizer

    _write_tokenizer(tmp_path)
    tokenizer = HFTokenizer(tmp_path)
    expected = "<|im_end|>\n<|im_start|>tool\n27<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.tool_response_renderer()("27") == expected

    class Run:  # what tool_episodes reads of a run
        config = tools_config.get_config("smoke")
        config.task.template = "chat"

    Run.tokenizer = tokenizer
    sampling = SamplingConfig(max_new_tokens=48, eos_ids=tuple(tokenizer.eos_ids))
    episode, environment = tool_episodes(Run, Run.config.rl, sampling)
    assert environment("<calc>3*9</calc>") == expected
    assert episode.stop_ids == tuple(tokenizer.encode("</calc>")) and episode.max_tokens == 48


@pytest.mark.parametrize("overrides,message", [
    ({"rl.fused_steps": 1}, "rl.fused_steps: multi-turn episodes (tools 'calc') need the host"),
    ({"rl.max_observation_tokens": 48}, "rl.max_observation_tokens: 48 leaves no room"),
    ({"rl.tools": "shell"}, "rl.tools: expected one of ['', 'calc', 'python', 'guess', "
                            "'guess_blind'] or 'json:' and tools of ['calc', 'guess', 'python'], "
                            "got 'shell'"),
    ({"eval_base.min_thinking_tokens": 4}, "eval_base.tools: budget forcing and multi-turn"),
])
def test_bad_tool_settings_fail_in_one_line(overrides, message):
    config = tools_config.get_config("smoke")
    for field, value in overrides.items():
        section, name = field.split(".")
        config[section][name] = value
    with pytest.raises(ConfigError) as error:
        validate(config, KINDS)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_tool_record_counts_calls_errors_and_observation_share():
    tokenizer = CharTokenizer.for_task(get_task("tool_arithmetic"))
    texts = ["<result>27</result>", "<result>error: division by zero</result>"]
    ids = [tokenizer.encode(t) for t in texts]
    tokens = np.zeros((2, 60), np.int32)
    observation = np.zeros((2, 60), bool)
    tokens[0, 2:2 + len(ids[0])], observation[0, 2:2 + len(ids[0])] = ids[0], True
    tokens[1, 1:1 + len(ids[1])], observation[1, 1:1 + len(ids[1])] = ids[1], True
    assert observation_texts(tokens, observation, tokenizer) == [[texts[0]], [texts[1]]]

    class Ro:  # the fields tool_record reads
        turns = np.array([1, 1])
        tool_errors = np.array([0, 1])
        tool_parse_failures = np.array([0, 2])
        loss_mask = np.zeros((2, 60), bool)
        loss_mask[:, 40:50] = True
        attention_mask = loss_mask | observation

    record = tool_record(Ro)
    assert record["tool_calls"] == 1.0 and record["tool_errors"] == 0.5
    assert record["tool_parse_failures"] == 1.0
    assert record["turns"] == 2.0 and record["tool_call_rate"] == 1.0
    share = observation.sum() / (observation.sum() + 20)
    assert record["observation_frac"] == pytest.approx(share)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`python -m grpo_jax.main --config=configs/tools.py:smoke --config.model.num_layers=1`,
    in process (one layer: the episodes and gradients of the smoke job in under half its
    CPU time; the runs started from it take its shape)."""
    workdir = tmp_path_factory.mktemp("tools_smoke")
    config = tools_config.get_config("smoke")
    config.mesh.num_devices = 1  # the tests' 8 virtual CPU devices would each do it all
    config.model.num_layers = 1
    train_and_evaluate(config, str(workdir))
    return workdir


def _rows(workdir, stage):
    return [r for r in read_metrics(workdir / "metrics.jsonl") if r["stage"] == stage]


def test_the_smoke_job_calls_the_tool_with_real_gradients(smoke):
    rows = _rows(smoke, "rl")
    assert len(rows) == 2
    assert max(r["tool_calls"] for r in rows) > 0 and max(r["observation_frac"] for r in rows) > 0
    assert all(r["reward_std"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert max(r["logp_diff_max"] for r in rows) < 1e-4  # the learner sees the sampler's tokens
    evals = {r["stage"]: r for r in read_metrics(smoke / "metrics.jsonl")
             if r["stage"].startswith("eval")}
    for name in tools_config.EVALS:  # with the tool, and without: no calls are answered
        assert "correct_call_rate" in evals[name]
        assert ("tool_call_rate" in evals[name]) == (not name.endswith("no_tool"))
    assert evals["eval_base"]["tool_calls"] > 0


def _from_smoke(smoke, stage: str, **fields):
    config = tools_config.get_config("smoke")
    config.model.init_from = str(smoke)
    config.mesh.num_devices = 1
    config.stages = stage
    if stage == "ppo":
        config.ppo = default_section("ppo")
        config.ppo.update(tools="calc", max_turns=2, max_observation_tokens=16,
                          max_new_tokens=48, num_prompts=16, group_size=1, rewards={
                              "accuracy": 1.0, "format": 0.2})
    config[stage].update(dict(checkpoint_every=1, **fields))
    return config


def test_grpo_on_episodes_resumes_mid_stage_bit_exactly(smoke, crash_and_resume):
    """4 updates with one pending rollout (max_staleness 1, its observation layout in the
    checkpoint): a run crashed at update 3 resumes and ends exactly as the straight one."""
    rows, _ = crash_and_resume(_from_smoke(smoke, "rl", steps=4, max_staleness=1), "rl")
    assert max(r["tool_calls"] for r in rows) > 0
    assert [r["staleness"] for r in rows] == [0, 1, 1, 1]


def _on_devices(smoke, tmp_path, stage, devices, **fields):
    config = _from_smoke(smoke, stage, **fields)
    config.mesh.num_devices = devices
    workdir = tmp_path / f"{stage}_{devices}"
    train_and_evaluate(config, str(workdir))
    return _rows(workdir, stage)


def _same_episodes_and_update(one, four):
    """The rows of one and of four devices: the same samples (the episodes' figures exactly),
    updates equal to float32 reduction order."""
    assert len(one) == len(four)
    for a, b in zip(one, four):
        for key in ("reward_mean", "tool_calls", "observation_frac", "completion_length"):
            assert a[key] == b[key], key
        for key in ("loss", "grad_norm", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_ppo_on_episodes_on_4_devices_as_on_one(smoke, tmp_path):
    """PPO's critic and GAE on multi-turn episodes (tool calls, real gradients, the
    learner's log-probs equal to the sampler's), with rows and weights sharded over 4
    virtual devices: the same episodes, the same update (one minibatch pass, so the program
    stays small). GRPO's sharded update is tested without episodes (the main job's smoke
    test, on all 8 devices); its episodes are sampled by the same code as these."""
    fields = dict(steps=1, beta=0.05, num_iterations=1, num_minibatches=1)
    rows = _on_devices(smoke, tmp_path, "ppo", 4, **fields)
    assert rows[0]["tool_calls"] > 0 and rows[0]["critic_grad_norm"] > 0
    one = _on_devices(smoke, tmp_path, "ppo", 1, **fields)
    assert one[0]["grad_norm"] > 0 and one[0]["logp_diff_max"] < 1e-4
    _same_episodes_and_update(one, rows)
    assert rows[0]["critic_grad_norm"] == pytest.approx(one[0]["critic_grad_norm"], rel=1e-4)


class _Flaky(Environment):
    """A user's environment whose every third call (reset or step) raises; the others answer
    "<result>ok</result>" with reward 0.25. The calculator's closing tag ends a turn."""

    stop_text = "</calc>"
    gives_rewards = True

    def __init__(self, render):
        self.render, self.calls = render, 0

    def _count(self):
        self.calls += 1
        if self.calls % 3 == 0:
            raise ValueError(f"flaky call {self.calls}")

    def reset(self, problem):
        self._count()
        return "", 0

    def step(self, state, action_text):
        self._count()
        return self.render("ok"), 0.25, False, state + 1


def _tool_run(tmp_path, monkeypatch, name, factory, rewards):
    """A 2-step RL run from a random one-layer policy (no pretraining, no evaluations, no
    checkpoints) whose calls `tools.ENVIRONMENTS[name]` answers; its rl metrics rows."""
    from grpo_jax import tools

    monkeypatch.setitem(tools.ENVIRONMENTS, name, factory)
    config = tools_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1  # as the smoke run's: the same programs
    config.stages = "rl"
    config.rl.update(tools=name, rewards=rewards, checkpoint_every=0)
    train_and_evaluate(config, str(tmp_path))
    return _rows(tmp_path, "rl")


def test_a_run_whose_environment_raises_on_every_third_call_finishes(tmp_path, monkeypatch):
    """The failed resets and steps are error observations counted in tool_errors; the run
    trains on."""
    rows = _tool_run(tmp_path, monkeypatch, "flaky", _Flaky,
                     {"accuracy": 1.0, "environment": 1.0})
    assert len(rows) == 2 and all(r["tool_errors"] > 0 for r in rows)
    assert max(r["tool_calls"] for r in rows) > 0
    assert max(r["reward/environment"] for r in rows) > 0  # the calls that went through


def test_a_run_whose_policy_writes_a_995_deep_call_finishes(tmp_path, monkeypatch):
    """JSON calls (`JsonToolEnvironment`) whose every turn the policy is forced to end with
    a call nested 995 deep: each is a parse failure, answered and counted."""
    from grpo_jax.sampling import episodes
    from grpo_jax.tools.calls import CLOSE, OPEN, JsonToolEnvironment

    @dataclasses.dataclass(frozen=True)
    class AtCalcTag(JsonToolEnvironment):
        @property
        def stop_text(self):  # one token of the run's vocabulary: a random policy writes it
            return "</calc>"

    deep = OPEN + '{"name": "calc", "arguments": {"expression": ' + "[" * 995 + "]" * 995 \
        + "}}" + CLOSE
    turn_texts = episodes.turn_texts
    monkeypatch.setattr(episodes, "turn_texts",
                        lambda *args: [text + deep for text in turn_texts(*args)])
    rows = _tool_run(tmp_path, monkeypatch, "deep_json",
                     lambda render: AtCalcTag(tools=("calc",), render=render),
                     {"accuracy": 1.0})
    assert len(rows) == 2 and all(r["tool_parse_failures"] > 0 for r in rows)
    assert max(r["tool_calls"] for r in rows) > 0
