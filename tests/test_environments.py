"""Stateful environments (`tools.Environment`): the guessing game by hand, the task's worked
solutions and rewards, episodes that the environment ends with per-turn rewards on the
turn's last token, the agents job's smoke run with real gradients, and the guard every
reset and step goes through (a failing, hanging or out-of-bounds call is an error
observation)."""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models
from grpo_jax.sampling import SamplingConfig
from grpo_jax.sampling.episodes import EpisodeConfig, generate_episodes, turn_texts
from grpo_jax.tasks import Example, get_task
from grpo_jax.tasks.guess_number import bisection, trace
from grpo_jax.text import CharTokenizer
from grpo_jax.tools import Environment, make_environment
from grpo_jax.tools.guard import NotStarted, guarded_reset, guarded_step, judge


def test_the_guessing_game_by_hand():
    environment = make_environment("guess")
    example = Example(id="g", prompt="20-27", answer="22", meta={"low": 20, "high": 27})
    observation, state = environment.reset(example)
    assert observation == "" and state.number == 22 and environment.stop_text == "</guess>"
    said, reward, done, state = environment.step(state, "<guess>24</guess>")
    assert (said, reward, done, state.guesses) == ("<result>lower</result>", 0.0, False, (24,))
    said, reward, done, state = environment.step(state, "hm <guess>20</guess>")
    assert (said, reward, done) == ("<result>higher</result>", 0.0, False)
    said, reward, done, _ = environment.step(state, "nothing")
    assert said == "<result>error: no guess</result>" and environment.is_error(said)
    assert environment.step(state, "<guess>22</guess>")[1:3] == (1.0, True)
    blind = make_environment("guess_blind")
    assert blind.step(blind.reset(example)[1], "<guess>24</guess>")[0] == "<result>no</result>"
    with pytest.raises(ValueError, match="unknown tool or environment 'dice'"):
        make_environment("dice")
    with pytest.raises(ValueError, match="the hidden number"):
        environment.reset(Example(id="x", prompt="?", answer="seven"))


def test_the_task_bisects_and_scores_turns():
    assert bisection(20, 27, 22) == [(24, "lower"), (22, "")]
    assert bisection(0, 15, 15) == [(8, "higher"), (12, "higher"), (14, "higher"), (15, "")]
    task = get_task("guess_number", search_rate=0.5, max_guesses=3)
    example = task.examples("train", 1, seed=3)[0]
    low, high = example.meta["low"], example.meta["high"]
    assert example.solution == trace(bisection(low, high, int(example.answer)))
    rewards = task.reward_fns()
    number = int(example.answer)
    best = trace([(number, "")])
    assert rewards["accuracy"](best, example) == 1.0 and rewards["turns"](best, example) == 0.0
    slow = trace([(g, "x") for g in range(low, high + 1) if g != number] + [(number, "")])
    extra = (high - low) - (len(bisection(low, high, number)) - 1)
    assert rewards["turns"](slow, example) == pytest.approx(-extra / (high - low + 1))
    assert rewards["turns"]("<guess>999</guess>", example) == -1.0
    assert task.extract_answer(slow) == str(number) and task.extract_answer("none") is None
    for seed in range(20):  # worked solutions stop at the budget, the last guess unanswered
        text, correct = task.solution(example, rng=seed, error_rate=0.3)
        assert text.count("<guess>") <= 3 and text.endswith("</guess>")
        assert correct == (f"<guess>{number}</guess>" in text)


class _Countdown(Environment):
    """A state of k turns left: answers "<k>" with reward 0.5 to each turn but the last,
    which ends the episode with reward 1."""

    stop_text = "?"
    gives_rewards = True

    def reset(self, problem):
        return "", problem

    def step(self, state, action_text):
        if state == 1:
            return "", 1.0, True, 0
        return f"<{state}>", 0.5, False, state - 1

    def is_parse_failure(self, observation_text):
        return observation_text == "<2>"  # counted as a call that did not parse


def test_an_environment_ends_episodes_and_its_rewards_sit_on_each_turns_last_token():
    tokenizer = CharTokenizer()
    config = models.named_config("tiny-1m", num_layers=1, vocab_size=tokenizer.vocab_size)
    model = models.Transformer(config, rngs=nnx.Rngs(1))
    prompts = [tokenizer.encode("ab")] * 4  # one greedy path: every row calls at once
    tokens = np.array(prompts, np.int32)
    mask = np.ones_like(tokens, bool)
    first = np.asarray(model(tokens, attention_mask=mask)[:, -1].argmax(-1))
    stop = (int(np.bincount(first).argmax()),)  # a stop token the model emits at once
    episode = EpisodeConfig(max_tokens=40, stop_ids=stop, max_turns=3,
                            max_observation_tokens=4,
                            sampling=SamplingConfig(max_new_tokens=1, greedy=True,
                                                    eos_ids=tokenizer.eos_ids))
    environment = _Countdown()
    turns_left = [1, 2, 1, 2]
    out = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0), config=episode,
                            tokenizer=tokenizer, observe=environment,
                            states=[environment.reset(k)[1] for k in turns_left])
    ended = np.asarray(out.ended_by_environment)
    generated, rewards = np.asarray(out.generated), np.asarray(out.turn_rewards)
    answered = np.asarray(out.turns)
    assert ended[[0, 2]].all()  # their first turn is their last: 1.0, nothing after it
    for row in np.flatnonzero(ended):
        nonzero = np.flatnonzero(rewards[row])
        assert rewards[row, nonzero].tolist() == [0.5] * (turns_left[row] - 1) + [1.0]
        assert nonzero[-1] == np.flatnonzero(generated[row])[-1]  # on the turn's last token
        assert answered[row] == turns_left[row] - 1
    for row in np.flatnonzero(~ended):  # answered once (0.5), then never closed a turn
        assert answered[row] == 1 and rewards[row].sum() == 0.5
    np.testing.assert_array_equal(out.parse_failures, [0, 1, 0, 1])
    assert not np.any(rewards[~generated])  # rewards only on generated tokens
    assert turn_texts(np.asarray(out.tokens), generated, np.asarray(out.observation), tokenizer)
    with pytest.raises(ValueError, match="3 states for 4 rows"):
        generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0),
                          config=dataclasses.replace(episode, max_turns=1),
                          tokenizer=tokenizer, observe=environment, states=[0, 0, 0])


def test_the_agents_smoke_job_plays_with_real_gradients(tmp_path):
    """GRPO, then PPO (GAE over the environment's per-turn rewards), on the guessing game
    played with JSON calls of the game and of the python tool in the miniature chat
    template, with a SentencePiece vocabulary learned on the traces (configs/agents.py:
    smoke, at one layer: its episodes and gradients in under half the four layers' CPU
    time; the tag format's job runs in the env_feedback study's mini tier)."""
    from configs import agents
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate
    from grpo_jax.stages import default_section

    config = agents.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.ppo = default_section("ppo")
    config.ppo.update({field: config.rl[field] for field in (
        "tools", "max_turns", "max_observation_tokens", "max_new_tokens", "num_prompts",
        "group_size", "steps", "rewards")})
    config.ppo.update(num_minibatches=1, checkpoint_every=0)
    config.stages = "pretrain,rl,ppo"
    assert config.rl.tools == "json:guess,python" and config.task.template == "chat"
    train_and_evaluate(config, str(tmp_path))
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for stage in ("rl", "ppo"):
        rows = [r for r in metrics if r["stage"] == stage]
        assert rows and all(r["tool_calls"] > 0 for r in rows), stage
        assert any(r["reward_std"] > 0 for r in rows) and any(r["grad_norm"] > 0 for r in rows)
        assert all("reward/environment" in r and "reward/turns" in r for r in rows)
        assert all("tool_parse_failures" in r for r in rows)


@pytest.mark.parametrize("loss_on_prompt", [False, True])
def test_supervised_rows_keep_the_environments_answers_out_of_the_loss(loss_on_prompt):
    """A worked solution's observation spans (`Task.observations`) are encoded on their
    own, attended to, and out of the loss; the policy's tokens and EOS are in it."""
    from grpo_jax.text.rows import encode_pair_rows

    task = get_task("guess_number")
    tokenizer = CharTokenizer.for_task(task)
    completion = "<guess>4</guess><result>lower</result><guess>2</guess>"
    tokens, attention, loss = encode_pair_rows(
        tokenizer, ["Q: 1-8\nA: "], [completion], observations=task.observations,
        loss_on_prompt=loss_on_prompt)
    ids, trained = tokens[0][attention[0]], loss[0][attention[0]]
    prompt = len(tokenizer.encode("Q: 1-8\nA: ")) + 1  # with BOS
    assert tokenizer.decode(ids[prompt:].tolist()) == completion
    assert tokenizer.decode(ids[prompt:][~trained[prompt:]].tolist()) == "<result>lower</result>"
    assert trained[-1] and ids[-1] == tokenizer.eos_id
    assert trained[1:prompt].all() == loss_on_prompt and not trained[0]
    plain = encode_pair_rows(tokenizer, ["Q: 1-8\nA: "], [completion], loss_on_prompt=True)
    np.testing.assert_array_equal(plain[0], tokens)  # the same tokens, more of them trained
    assert plain[2].sum() > loss.sum() or not loss_on_prompt


def test_a_rollouts_token_rewards_reach_the_batch():
    from grpo_jax.rl.rollout import Rollout

    turns = np.array([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]], np.float32)
    ro = Rollout(prompt_tokens=np.ones((2, 2), np.int32), prompt_mask=np.ones((2, 2), bool),
                 tokens=np.ones((2, 3), np.int32), attention_mask=np.ones((2, 3), bool),
                 loss_mask=np.ones((2, 3), bool), behaviour_logp=np.zeros((2, 3), np.float32),
                 rewards=np.array([1.5, 0.0], np.float32), version=np.zeros(2, np.int32),
                 token_rewards=turns)
    np.testing.assert_array_equal(ro.to_batch().token_rewards, turns)
    assert ro.replace(token_rewards=None).to_batch().token_rewards is None
    np.testing.assert_array_equal(ro.take_rows([1]).to_batch().token_rewards, turns[1:])


class _Unruly(Environment):
    """A user's environment that misbehaves as `self.how` says (reset: "reset"; step: an
    exception, a hang, a huge or non-text observation, a bad reward or return)."""

    stop_text = "?"
    call_seconds = 0.2

    def __init__(self, how):
        self.how, self.release, self.steps = how, threading.Event(), 0

    def reset(self, problem):
        if self.how == "reset":
            raise RuntimeError("no such problem")
        return "<start>", 7

    def step(self, state, action_text):
        self.steps += 1
        answers = {"huge": ("x" * 10**6, 0.0, False, 8), "nan": ("ok", float("nan"), False, 8),
                   "inf32": ("ok", 1e300, False, 8), "array": ("ok", np.ones(2), False, 8),
                   "text": ("ok", "1", False, 8), "bytes": (b"ok", 0.0, False, 8),
                   "short": ("ok", 0.0), "fine": ("ok", np.float32(0.5), np.True_, 8)}
        if self.how == "raise":
            raise ValueError("bad\naction " + "y" * 500)
        if self.how == "exit":
            raise SystemExit(0)
        if self.how == "interrupt":
            raise KeyboardInterrupt
        if self.how == "hang":
            self.release.wait(30)
        return answers[self.how]


@pytest.mark.parametrize("how,reason", [
    ("raise", "error: environment step raised ValueError: bad action yyy"),
    ("exit", "error: environment step raised SystemExit: 0"),
    ("hang", "error: environment step gave no answer within 0.2 s"),
    ("huge", "error: environment step answered 1000000 characters, over 8192"),
    ("bytes", "error: environment step gave a bytes, not text"),
    ("nan", "error: environment step's reward nan is not a finite float32 number"),
    ("inf32", "error: environment step's reward 1e+300 is not a finite float32 number"),
    ("array", "error: environment step's reward array([1., 1.]) is not a finite"),
    ("text", "error: environment step's reward '1' is not a finite float32 number"),
    ("short", "error: environment step returned tuple, not (observation, reward, done, "),
])
def test_a_step_that_fails_is_an_error_observation_and_the_episode_goes_on(how, reason):
    environment = _Unruly(how)
    start = guarded_reset(environment, None)
    assert start == ("<start>", 7, False)
    began = time.monotonic()
    answer = guarded_step(environment, 7, "turn?")
    environment.release.set()
    assert time.monotonic() - began < 1.5  # the bound holds: 0.2 s
    assert answer.observation.startswith("<result>" + reason) and answer.failed
    assert "\n" not in answer.observation and len(answer.observation) < 200
    assert (answer.reward, answer.done, answer.state) == (0.0, False, 7)


def test_a_good_step_passes_the_guard_and_keyboard_interrupt_is_the_runs_stop():
    answer = guarded_step(_Unruly("fine"), 7, "turn?")
    assert answer == ("ok", 0.5, True, 8, False) and type(answer.done) is bool
    with pytest.raises(KeyboardInterrupt):
        guarded_step(_Unruly("interrupt"), 7, "turn?")
    assert judge(None, "x") is False and judge(lambda text: 1 / 0, "x") is None


def test_a_failed_reset_starts_an_episode_whose_calls_answer_its_error():
    """No observation (the prompt bucket is fixed), a state the environment's step never
    sees: each call is answered with the reset's error line and counted."""
    environment = _Unruly("reset")
    start = guarded_reset(environment, None)
    assert start.observation == "" and start.failed and isinstance(start.state, NotStarted)
    answer = guarded_step(environment, start.state, "turn?")
    assert answer.observation == ("<result>error: environment reset raised RuntimeError: no "
                                  "such problem</result>")
    assert answer.failed and answer.state is start.state and environment.steps == 0
