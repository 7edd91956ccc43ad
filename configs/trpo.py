"""The main job with TRPO (natural-gradient steps in a KL trust region) instead of GRPO.

pretrain -> eval_base -> trpo -> eval_final on the arithmetic task, as configs/default.py.
One TRPO step per rollout batch on group-normalised advantages; the exact KL over the
vocabulary makes it a small-model algorithm. Every field: grpo_jax/stages/trpo.py.

    python -m grpo_jax.main --config=configs/trpo.py
    python -m grpo_jax.main --config=configs/trpo.py:smoke   # seconds on CPU
    python -m grpo_jax.main --config=configs/trpo.py --config.trpo.max_kl=0.02
"""

from grpo_jax.config_presets import main_job
from grpo_jax.stages import default_section


def get_config(preset: str | None = None):
    if preset not in (None, "", "cpu", "smoke"):
        raise ValueError(f"unknown preset {preset!r} for configs/trpo.py; expected smoke or "
                         "cpu")
    config = main_job(preset)
    config.stages = "pretrain,eval_base,trpo,eval_final"
    config.trpo = default_section("trpo")
    # A TRPO step costs ~40 forward passes (10 conjugate-gradient Fisher-vector products and
    # up to 10 line-search candidates), so this stage takes fewer, smaller steps than GRPO.
    config.trpo.steps = 30
    config.trpo.num_prompts = 16
    config.trpo.group_size = config.rl.group_size
    config.trpo.max_kl = 0.01  # trust-region radius (mean KL per completion token)
    config.trpo.max_new_tokens = config.rl.max_new_tokens
    config.trpo.rewards = config.rl.rewards
    del config.rl
    if preset == "smoke":
        # overlong_cache: rewards that differ within groups (real gradients).
        config.trpo.update(dict(steps=2, num_prompts=4, group_size=4, max_new_tokens=24,
                                cg_iters=4, checkpoint_every=1, overlong_cache=8))
    return config
