"""R1-Zero vs R1's cold start, from one pretrained base (DeepSeek-R1, arXiv:2501.12948).

Two pipelines from the final parameters of one base run (the main job's pretraining,
seed 0: noisy worked solutions, 15% of them malformed), both with 90 GRPO steps of 16
prompts x 8 in two RL stages (60 + 30, the main job's RL settings):

  zero (R1-Zero): eval_base -> rl (60) -> eval_rl -> final_rl (30) -> eval_final
  cold (R1):      cold_start SFT (256 clean solutions) -> eval_cold -> rl (60) -> eval_rl
                  -> rejection_sft (verified samples of the RL policy) -> eval_rsft
                  -> final_rl (30) -> eval_final

Every eval uses the same 128 held-out problems (task.eval_seed). The preset picks the
pipeline (`config.py:zero` or `config.py:cold`); see README.md next to this file for the
commands.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import default  # noqa: E402
from grpo_jax.stages import default_section  # noqa: E402


def get_config(preset=None):
    if preset not in ("zero", "cold"):
        raise ValueError(f"experiments/cold_start/config.py needs a preset: zero or cold, got "
                         f"{preset!r}")
    config = default.get_config()
    del config.pretrain
    # The base run's workdir; the sweep passes it with --config.model.init_from=...
    config.model.init_from = ""
    config.rl.steps = 60
    config.rl.num_prompts = 16
    config.rl.fused_steps = 0
    config.final_rl = ml_collections.ConfigDict(config.rl.to_dict())
    config.final_rl.steps = 30
    for name in ("eval_rl", "eval_cold", "eval_rsft"):
        config[name] = ml_collections.ConfigDict(config.eval_base.to_dict())
    if preset == "zero":
        config.stages = "eval_base,rl,eval_rl,final_rl,eval_final"
        return config

    # Cold start: a few clean, well-formed worked solutions (R1 sec. 2.3.1: thousands of
    # readable long CoT examples before RL; here 256 against the base's 96,000 noisy ones).
    config.cold_start = default_section("sft")
    config.cold_start.num_examples = 256
    config.cold_start.error_rate = 0.0
    config.cold_start.steps = 100
    config.cold_start.batch_size = 32
    config.cold_start.lr = 1e-3
    # Rejection sampling (R1 sec. 2.3.3): verified, well-formed samples of the RL policy on
    # training problems, deduplicated, fine-tuned on.
    config.rejection_sft = default_section("rejection_sft")
    config.rejection_sft.num_problems = 512
    config.rejection_sft.num_samples = 4
    config.rejection_sft.sample_batch_size = 256
    config.rejection_sft.max_new_tokens = config.rl.max_new_tokens
    config.rejection_sft.steps = 100
    config.rejection_sft.batch_size = 32
    config.rejection_sft.lr = 1e-3
    config.stages = ("cold_start,eval_cold,rl,eval_rl,rejection_sft,eval_rsft,final_rl,"
                     "eval_final")
    del config.eval_base
    return config
