"""Device rewards against the host rules, and the fused RL iteration against the host loop."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default as default_config
from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.rewards import (accuracy_reward, answers_match, extract_answer,
                              strict_format_reward)
from grpo_jax.rewards.device import (TokenTable, integer_answers, make_device_reward,
                                     register_device_reward)
from grpo_jax.runner import ConfigError
from grpo_jax.tasks.base import Example
from grpo_jax.text import CharTokenizer

TAGS = ("<think>", "</think>", "<answer>", "</answer>")


# The host reward "digit_share" (the share of digit characters: it differs within groups
# even for an untrained model, so the updates have real gradients) is the multi-process
# tests' own; loading their config registers it.
_spec = importlib.util.spec_from_file_location(
    "multiprocess_config", os.path.join(os.path.dirname(__file__), "configs", "multiprocess.py"))
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))


@register_device_reward("digit_share")
def device_digit_share(tokenizer):
    table = TokenTable(tokenizer)

    def fn(tokens, mask, answers):
        del answers
        text = mask & (table.length[tokens] > 0)
        chars = jnp.sum(jnp.where(text, table.length[tokens], 0), -1)
        return jnp.sum(text & table.digit[tokens], -1) / jnp.maximum(chars, 1)

    return fn



def random_completion(rng, reference: int) -> str:
    """Text near the R1-Zero layout: tags dropped, doubled or reordered, junk around the
    blocks, and answers in and out of the integer grammar."""
    answer = rng.choice([
        str(reference), str(reference + int(rng.integers(-2, 3))), f"0{reference}",
        f"+{reference}", f" {reference} ", f"{reference}.", f"{reference}.00",
        f"{reference}.5", f"{str(reference)[:1]} {str(reference)[1:]}", "", " ", "-",
        f"{reference}a", f"{reference}-1", ".0", "0.", f"--{reference}", "x", f"{reference}+",
    ])
    think = "".join(rng.choice(list("0123456789+-*= ab"), size=int(rng.integers(0, 6))))
    parts = ["<think>", think, "</think>", rng.choice(["", " ", "\n", "x"]), "<answer>",
             answer, "</answer>"]
    action = rng.integers(8)
    if action == 0:  # a tag dropped
        parts.pop(int(rng.choice([0, 2, 4, 6])))
    elif action == 1:  # a tag doubled
        parts.insert(int(rng.integers(len(parts) + 1)), str(rng.choice(TAGS)))
    elif action == 2:  # blocks swapped
        parts = parts[3:] + parts[:3]
    elif action == 3:  # junk after the answer
        parts.append(str(rng.choice(["x", " ", "1", "<answer>7</answer>"])))
    prefix = str(rng.choice(["", " ", "\n ", "a"]))
    return prefix + "".join(parts)


def test_device_rewards_equal_the_host_rules_on_the_tag_layout():
    tokenizer = CharTokenizer()
    accuracy = jax.jit(make_device_reward("accuracy", tokenizer))
    fmt = jax.jit(make_device_reward("format", tokenizer))
    rng = np.random.default_rng(0)
    n, width = 600, 48
    tokens = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), bool)
    texts, references = [], []
    for row in range(n):
        reference = int(rng.integers(-40, 800))
        text = random_completion(rng, reference)
        ids = tokenizer.encode(text)[:width - 1]
        if rng.random() < 0.5:
            ids.append(tokenizer.eos_id)  # the sampler keeps the EOS in the mask
        tokens[row, :len(ids)] = ids
        mask[row, :len(ids)] = True
        tokens[row, len(ids):] = rng.integers(3, tokenizer.vocab_size, width - len(ids))
        texts.append(tokenizer.decode(ids))
        references.append(reference)
    # The host's exact reading (math-verify off): math-verify also accepts expressions
    # equal to the reference ("--7", "7+", "0-7"), which the device reading does not.
    host_acc = np.asarray([float(answers_match(extract_answer(t), str(r), symbolic=False))
                           for t, r in zip(texts, references)])
    host_fmt = np.asarray([strict_format_reward(t) for t in texts])
    dev_acc = np.asarray(accuracy(tokens, mask, np.asarray(references, np.int32)))
    dev_fmt = np.asarray(fmt(tokens, mask, np.asarray(references, np.int32)))
    # Both outcomes are well represented, so the agreement is not a trivial one.
    assert 0.15 < host_acc.mean() < 0.85 and 0.15 < host_fmt.mean() < 0.85
    for name, host, dev in (("accuracy", host_acc, dev_acc), ("format", host_fmt, dev_fmt)):
        wrong = np.flatnonzero(host != dev)
        assert not len(wrong), (name, [(texts[i], references[i], host[i]) for i in wrong[:5]])
    ids = tokenizer.encode("<think>1</think><answer>--7</answer>")
    assert accuracy_reward(tokenizer.decode(ids), "7") == 1.0  # math-verify: --7 = 7
    assert float(accuracy(np.asarray([ids]), np.ones((1, len(ids)), bool),
                          np.asarray([7], np.int32))[0]) == 0.0


def test_device_rewards_refuse_what_they_cannot_read():
    class Words:  # multi-character tokens besides the tags
        vocab_size = 6

        def decode(self, ids):
            return ["", "<think>", "</think>", "<answer>", "</answer>", "12"][ids[0]]

    with pytest.raises(ValueError, match="character-level tokenizer.*'12'"):
        make_device_reward("format", Words())
    with pytest.raises(ValueError, match="no device reward 'language'"):
        make_device_reward("language", CharTokenizer())
    with pytest.raises(ValueError, match=r"example 'e1' has '3/4'"):
        integer_answers([Example(id="e0", prompt="", answer="3"),
                         Example(id="e1", prompt="", answer="3/4")])


def fused_config(fused_steps, **rl):
    config = default_config.get_config("smoke")
    config.stages = "rl"
    config.model.num_layers = 1
    config.rl.steps = 4
    config.rl.num_prompts = 4
    config.rl.group_size = 4
    config.rl.max_new_tokens = 8
    config.rl.checkpoint_every = 2
    config.rl.beta = 0.04  # the reference forward runs inside the program too
    config.rl.rewards = {"accuracy": 1.0, "format": 0.2, "digit_share": 1.0}
    config.rl.fused_steps = fused_steps
    config.rl.overlong_cache = 0  # a host-side reward: the fused program has none
    config.rl.update(rl)
    return config


@pytest.mark.parametrize("rl", [{}, {"algorithm": "reinforce_pp", "entropy_coef": 0.01}])
def test_fused_iterations_compute_what_the_host_loop_computes(tmp_path, rl):
    """The host loop and the fused program build the same batch and run the same prepare
    function and update: GRPO, and REINFORCE++ (per-token advantages, the KL in the reward)
    with an entropy bonus."""
    rows = {}
    for k in (0, 2):
        train_and_evaluate(fused_config(k, **rl), str(tmp_path / f"k{k}"))
        rows[k] = read_metrics(str(tmp_path / f"k{k}" / "metrics.jsonl"))
    host, fused = rows[0], rows[2]
    assert [r["stage_step"] for r in fused] == [1, 2, 3, 4]
    # The same samples (rewards, lengths) and the same updates up to float32 rounding.
    for a, b in zip(host, fused):
        for key in ("reward_mean", "reward/digit_share", "reward/accuracy", "reward/format",
                    "completion_length", "truncated_frac", "pass@1", "zero_std_groups"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
        for key in ("loss", "grad_norm", "entropy", "kl_ref", "clip_frac", "learning_rate"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
    assert all(r["grad_norm"] > 0 for r in fused)
    assert len({r["reward/digit_share"] for r in fused}) > 1
    # The policy moved away from the reference (REINFORCE++ logs k1, a signed estimate).
    assert fused[-1]["kl_ref"] > 0 if not rl else fused[-1]["kl_ref"] != 0


def test_fused_iterations_resume_bit_exactly(crash_and_resume):
    crash_and_resume(fused_config(2), "rl")


@pytest.mark.parametrize("field, value, message", [
    ("steps", 5, "steps 5 is not a multiple of fused_steps 2"),
    ("num_minibatches", 2, "needs num_minibatches = 1"),
    ("algorithm", "dapo", "needs dynamic_sampling = off"),
    ("rewards", {"accuracy": 1.0, "format_soft": 0.1}, "'format_soft' has no device version"),
])
def test_fused_steps_errors_name_the_field(tmp_path, field, value, message):
    config = fused_config(2)
    config.rl[field] = value
    with pytest.raises(ConfigError, match=f"rl.fused_steps: .*{message}"):
        train_and_evaluate(config, str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run" / "config.json")
