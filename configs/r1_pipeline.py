"""The DeepSeek-R1 recipe in miniature (https://arxiv.org/abs/2501.12948, sec. 2.3).

cold-start SFT on clean worked solutions -> eval -> reasoning RL (GRPO) with accuracy, format
and language-consistency rewards -> rejection-sampling SFT on verified samples of the RL
policy (mixed with clean solutions) -> final RL -> eval; the same report as the main job.

    python -m grpo_jax.main --config=configs/r1_pipeline.py
    python -m grpo_jax.main --config=configs/r1_pipeline.py:smoke   # under a minute on CPU

The "language" reward is not a task reward: reward names resolve to the task's rewards, then
the stage kinds' reward sources, then grpo_jax.rewards' built-ins (grpo_jax/runner/rewards.py).
"""

import ml_collections

from grpo_jax.config_presets import main_job
from grpo_jax.stages import default_section


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    config = main_job(None)
    # An eval after every training stage: the report has one column per eval stage.
    config.stages = ("cold_start,eval_base,reasoning_rl,eval_reasoning_rl,rejection_sft,"
                     "eval_rejection_sft,final_rl,eval_final")
    config.eval_reasoning_rl = ml_collections.ConfigDict(config.eval_base.to_dict())
    config.eval_rejection_sft = ml_collections.ConfigDict(config.eval_base.to_dict())
    # Arithmetic plus the language-consistency reward of R1 (sec. 2.3.2).
    config.task.name = "arithmetic"
    config.task.template = "plain"
    # > 0: every step of a worked solution is introduced by a word, written in Greek with this
    # probability in the cold-start data, so the language reward differs between completions
    # and can act (at 0 the traces have no words and it is 1.0 for every output).
    config.task.kwargs.mixed_script_rate = 0.0

    # ---- cold start: SFT on clean worked solutions (completion-only loss) ------------------
    config.cold_start = default_section("sft")
    config.cold_start.num_examples = 2048  # clean worked solutions
    config.cold_start.error_rate = 0.3  # a few wrong steps keep pass@1 low for RL to raise
    # As many steps as the main job's pretraining: with 400 the cold-start model reached only
    # ~8% held-out pass@1 and neither GRPO stage measurably raised it (three seeds).
    config.cold_start.steps = 1500
    config.cold_start.batch_size = 64
    config.cold_start.lr = 3e-3
    del config.pretrain

    # ---- reasoning RL: GRPO with accuracy + format + language consistency ----------------
    config.rl.fused_steps = 0  # the language reward is scored on the host
    config.reasoning_rl = ml_collections.ConfigDict(config.rl.to_dict())
    config.reasoning_rl.rewards = ml_collections.ConfigDict(
        {"accuracy": 1.0, "format": 0.2, "language": 0.1})
    config.reasoning_rl.steps = 80

    # ---- rejection-sampling SFT on verified samples of the RL policy ---------------------
    config.rejection_sft = default_section("rejection_sft")
    config.rejection_sft.num_problems = 512
    config.rejection_sft.num_samples = 4
    config.rejection_sft.sample_batch_size = 256
    config.rejection_sft.max_new_tokens = config.rl.max_new_tokens
    config.rejection_sft.mix_sft_examples = 256  # clean solutions mixed in (R1's non-reasoning data)
    config.rejection_sft.steps = 100
    config.rejection_sft.batch_size = 64
    config.rejection_sft.lr = 1e-3

    # ---- final RL: accuracy + format --------------------------------------------------------
    config.final_rl = ml_collections.ConfigDict(config.rl.to_dict())
    config.final_rl.steps = 40
    del config.rl  # the two RL stages above are copies of the main job's rl section

    if preset in (None, "", "cpu"):
        pass
    elif preset == "smoke":
        config.task.train_size = 128
        config.task.eval_size = 8
        config.cold_start.num_examples = 64
        config.cold_start.steps = 3
        config.cold_start.batch_size = 16
        for name in ("reasoning_rl", "final_rl"):
            config[name].steps = 1
            config[name].num_prompts = 4
            config[name].group_size = 4
            config[name].max_new_tokens = 24
            config[name].checkpoint_every = 0
            config[name].overlong_cache = 8  # rewards that differ within groups
        config.rejection_sft.num_problems = 8
        config.rejection_sft.num_samples = 2
        config.rejection_sft.sample_batch_size = 16
        config.rejection_sft.max_new_tokens = 24
        config.rejection_sft.mix_sft_examples = 16
        config.rejection_sft.steps = 2
        config.rejection_sft.batch_size = 16
        for section in (config.eval_base, config.eval_reasoning_rl, config.eval_rejection_sft,
                        config.eval_final):
            section.num_samples = 2
            section.batch_size = 16
            section.max_new_tokens = 24
    else:
        raise ValueError(f"unknown preset {preset!r} for configs/r1_pipeline.py; expected smoke "
                         "or cpu")
    return config
