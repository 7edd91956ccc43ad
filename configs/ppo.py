"""The main job with PPO (a critic, GAE, per-token KL reward) instead of GRPO.

pretrain -> eval_base -> ppo -> eval_final on the arithmetic task, as configs/default.py.
Every field of the ppo section, with its comment: grpo_jax/stages/ppo.py.

    python -m grpo_jax.main --config=configs/ppo.py
    python -m grpo_jax.main --config=configs/ppo.py:smoke   # seconds on CPU
    python -m grpo_jax.main --config=configs/ppo.py --config.ppo.adaptive_kl=True
"""

from grpo_jax.config_presets import main_job
from grpo_jax.stages import default_section


def get_config(preset: str | None = None):
    if preset not in (None, "", "cpu", "smoke"):
        raise ValueError(f"unknown preset {preset!r} for configs/ppo.py; expected smoke or cpu")
    config = main_job(preset)
    config.stages = "pretrain,eval_base,ppo,eval_final"
    config.ppo = default_section("ppo")
    config.ppo.steps = 80
    config.ppo.num_prompts = 64  # one completion each: the critic is the baseline
    config.ppo.group_size = 1
    config.ppo.num_iterations = 2  # PPO epochs over each rollout batch
    config.ppo.num_minibatches = 2
    config.ppo.lr = 2e-4
    config.ppo.critic_lr = 1e-3
    config.ppo.beta = 0.01  # per-token KL reward coefficient
    config.ppo.max_new_tokens = config.rl.max_new_tokens
    config.ppo.rewards = config.rl.rewards
    del config.rl
    if preset == "smoke":
        # overlong_cache: rewards that differ between completions (real gradients).
        config.ppo.update(dict(steps=2, num_prompts=16, max_new_tokens=24, checkpoint_every=1,
                               overlong_cache=8))
    return config
