"""What every stage kind shares: the stage-kind registry, the `Run`, the toolkit (optimizer,
progress, prompts, sampling settings, rollouts, device batches, logging), the config field
groups, the one RL loop and its rollout sources, supervised training, validation and the
run report.

The runner never imports grpo_jax.stages or grpo_jax.pipeline: the pipeline hands it the
registry of stage kinds.
"""

from grpo_jax.runner.registry import Registry, StageKind
from grpo_jax.runner.rl_loop import CORE_METRICS, Learner, rl_loop
from grpo_jax.runner.run import Run, StageSpec
from grpo_jax.runner.supervised import train_supervised
from grpo_jax.runner.validation import ConfigError, validate

__all__ = ["CORE_METRICS", "ConfigError", "Learner", "Registry", "Run", "StageKind",
           "StageSpec", "rl_loop", "train_supervised", "validate"]
