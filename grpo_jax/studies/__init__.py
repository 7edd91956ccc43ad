"""The studies of experiments/, each one command: `python -m grpo_jax.studies run NAME`.

    python -m grpo_jax.studies list
    python -m grpo_jax.studies run NAME --tier=full|mini --workdir=DIR [--publish]

A study is data (`common.Study`, defined in `grpo_jax/studies/<name>.py`): the config of the
pretrained base it needs (a run keyed by its config, built once under DIR/bases/ and reused by
every study that asks for the same config), its arms' configs, the seeds and bases of each
tier, and its analysis. `run` builds the bases, runs the arms with paired seeds (finished runs
are skipped, so the same command resumes), analyses, and writes DIR/NAME/out/: summary.json
(one schema: `grpo_jax.studies.summary`), table.md, the plots and README.md (the study's README
with its results block regenerated from summary.json). `--publish` copies them into
experiments/NAME/; nothing there is written otherwise. The mini tier is the same pipeline at
toy size (its numbers mean nothing); the tests run it for every study.
"""

from __future__ import annotations

import importlib

# Every study of experiments/, in the order of experiments/README.md.
NAMES = ("baselines", "length_bias", "difficulty_bias", "pass_at_k", "length_growth",
         "distill_vs_rl", "budget_forcing", "cold_start", "kl_beta", "off_policy", "tool_use",
         "env_feedback", "sharpening", "forking_tokens", "spurious_rewards", "update_sparsity",
         "one_shot", "updates_per_batch", "expert_iteration", "ppo_vs_grpo", "trpo_vs_ppo",
         "language_consistency", "reward_hacking", "onpolicy_distill", "gae_lambda",
         "negative_samples", "entropy_dynamics", "rl_steps", "test_time_scaling",
         "generalization", "critic_memory", "overoptimization", "pretraining_vs_rl",
         "forgetting", "code_rewards", "distillation_bias", "cot_faithfulness",
         "replication")

__all__ = ["NAMES", "get"]


def get(name: str):
    """The `common.Study` of a study (its module, imported when asked for)."""
    if name not in NAMES:
        raise ValueError(f"unknown study {name!r}; expected one of {', '.join(NAMES)}")
    return importlib.import_module(f"grpo_jax.studies.{name}").STUDY
