"""The main job on reasoning-gym generators (grpo_jax/tasks/reasoning_gym.py), on a CPU.

Pretrain a tiny character-level model on noisy worked solutions of the generators' problems,
evaluate it on held-out problems, run GRPO with the dataset's own scorer as the accuracy
reward, evaluate again. Needs the optional package: pip install -e ".[reasoning_gym]".

    python -m grpo_jax.main --config=configs/reasoning_gym_tasks.py:chain_sum \
        --workdir=runs/rg_chain_sum
    python -m grpo_jax.main --config=configs/reasoning_gym_tasks.py \
        --config.task.kwargs.datasets=chain_sum:2,spell_backward:1

Presets (after the colon), one per task family, each with small generator settings:
  chain_sum        (the default) arithmetic: sums of 2-3 one-digit terms with + and -
  letter_counting  counting: a letter's occurrences in 2 words of text
  spell_backward   string manipulation: a 3-5 letter word spelled backward
  smoke            seconds: chain_sum at tiny sizes, for tests
Every other field, with its comment: grpo_jax/config_presets.py (`main_job`).
"""

import ml_collections

from grpo_jax.config_presets import main_job

# Generator settings of each preset's family (the fields of reasoning-gym's config
# dataclasses); a mix named on the command line uses these for the datasets it shares.
DATASET_KWARGS = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    "letter_counting": {"min_words": 2, "max_words": 2},
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
}
PRESETS = ("chain_sum", "letter_counting", "spell_backward", "smoke")


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    preset = preset or "chain_sum"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} for configs/reasoning_gym_tasks.py; expected "
                         f"one of {', '.join(PRESETS)}")
    config = main_job("smoke" if preset == "smoke" else "cpu")
    config.task.name = "reasoning_gym"
    # datasets: "name[:weight],..."; dataset_kwargs: each generator's settings;
    # test_fraction: the share of each dataset's questions held out.
    config.task.kwargs = ml_collections.ConfigDict({
        "datasets": "chain_sum" if preset == "smoke" else preset,
        "dataset_kwargs": DATASET_KWARGS,
        "test_fraction": 0.1,
    })
    config.task.prompt_len = 0  # measured at start-up (the generators' questions are long)
    config.task.train_size = 4000
    config.task.solution_error_rate = 0.3  # chance that a worked-solution step is wrong
    config.task.format_error_rate = 0.1
    config.model.max_seq_len = 128  # prompt bucket (<= 96) + 32 new tokens
    # An example is 60-100 tokens (most of it the generator's question): 32 a step, unpacked.
    config.pretrain.pack_len = 128
    config.pretrain.batch_size = 32
    config.pretrain.steps = 800
    config.rl.max_new_tokens = 32
    config.rl.fused_steps = 0  # the dataset's scorer runs on the host
    config.rl.steps = 40
    config.rl.checkpoint_every = 20
    for section in (config.eval_base, config.eval_final):
        section.max_new_tokens = 32
    if preset == "chain_sum":
        # 800 pretraining steps left a base of pass@1 0.15 / pass@8 0.66 that 40 or 80 GRPO
        # steps raised by 0.07-0.09 only (docs/reasoning_gym.md, Results).
        config.pretrain.steps = 2000
        config.rl.steps = 80
    if preset == "letter_counting":  # prompts up to 95 tokens, worked solutions up to 39
        config.model.max_seq_len = config.pretrain.pack_len = 136
        config.rl.max_new_tokens = 40
        for section in (config.eval_base, config.eval_final):
            section.max_new_tokens = 40
    if preset == "smoke":
        config.task.train_size = 64
        config.task.eval_size = 8
        config.rl.max_new_tokens = 24
        config.rl.steps = 2
        config.rl.checkpoint_every = 1
        config.pretrain.steps = 3
        for section in (config.eval_base, config.eval_final):
            section.max_new_tokens = 24
    return config
