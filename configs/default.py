"""The CPU main job: R1-Zero in miniature.

Build a synthetic arithmetic task and a character tokenizer, pretrain a tiny base model on
noisy worked solutions (so it has low pass@1 but high pass@8), evaluate it, run GRPO with
accuracy and format rewards, evaluate again, and write report.md / report.json / plots.

    python -m grpo_jax.main                                   # this config
    python -m grpo_jax.main --config=configs/default.py:smoke # a seconds-long smoke run
    python -m grpo_jax.main --config.rl.algorithm=dr_grpo --config.rl.beta=0.0
    python -m grpo_jax.main --config.rl.algorithm=dapo --config.rl.fused_steps=0
    (DAPO's dynamic sampling resamples on the host, so it runs the host loop)

Presets (after the colon): "smoke" (tiny sizes for tests), "cpu" (the default).
configs/ppo.py and configs/trpo.py run the same job with the PPO or TRPO stage instead.
Each job in configs/ also runs by name from any folder: `--config=main:smoke`,
`--config=ppo` (grpo_jax.config_presets.JOBS; `api.config("ppo:smoke")` from Python).
Every field, with its comment: grpo_jax/config_presets.py (`main_job`), which other configs and
the studies (grpo_jax/studies) start from.
"""

import ml_collections

from grpo_jax.config_presets import main_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return main_job(preset)
