"""The smoke RL stage the multi-process tests run: one random 1-layer model, 3 GRPO steps of
4 prompts x 4 completions, a checkpoint every step. Loading it registers the reward
"digit_share" (the share of digits in a completion): the untrained model earns no task
reward, and this one differs within groups, so the steps have real gradients."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import default  # noqa: E402
from grpo_jax.runner.rewards import register_reward_source  # noqa: E402


def digit_share(completion, example):
    del example
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


register_reward_source("digit_share")(lambda run, section: digit_share)


def get_config(preset=None):
    del preset
    config = default.get_config("smoke")
    config.stages = "rl"
    config.model.num_layers = 1
    config.rl.steps = 3
    config.rl.num_prompts = 4
    config.rl.group_size = 4
    config.rl.max_new_tokens = 8
    config.rl.checkpoint_every = 1
    config.rl.rewards = {"accuracy": 1.0, "digit_share": 1.0}
    return config
