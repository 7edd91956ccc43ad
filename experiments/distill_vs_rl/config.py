"""Distillation from a larger RL-trained teacher vs RL on the small student itself
(DeepSeek-R1, arXiv:2501.12948, sec. 4.1: distilled Qwen-32B against RL on Qwen-32B).

One pretrained student (tiny-300k, the main job's pretraining) and one teacher (tiny-1m
after the main job's pretraining and 60 GRPO steps), both passed on the command line. Both
arms start from the student's final parameters and see the same number of sequences:

  rl:      eval_base -> 60 GRPO steps of 16 prompts x 8 (7,680 samples of the student,
           each in one update) -> eval_final
  distill: eval_base -> the teacher samples 8 completions for each of 960 training
           problems (7,680), the verified and well-formed ones are kept, and the student
           is fine-tuned on them for 120 steps of 64 rows (7,680 rows) -> eval_final

Every eval uses the same 128 held-out problems (task.eval_seed). The preset picks the arm
(`config.py:rl` or `config.py:distill`); see README.md next to this file for the commands.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import default  # noqa: E402
from grpo_jax.stages import default_section  # noqa: E402


def get_config(preset=None):
    if preset not in ("rl", "distill"):
        raise ValueError(f"experiments/distill_vs_rl/config.py needs a preset: rl or distill, "
                         f"got {preset!r}")
    config = default.get_config()
    del config.pretrain
    # The student base's workdir; the sweep passes it with --config.model.init_from=...
    config.model.init_from = ""
    config.model.name = "tiny-300k"
    if preset == "rl":
        config.rl.steps = 60
        config.rl.num_prompts = 16
        config.rl.fused_steps = 0
        config.stages = "eval_base,rl,eval_final"
        return config
    del config.rl
    config.distill = default_section("distill")
    # The teacher's workdir: --config.distill.teacher=... on the command line.
    config.distill.student_model = "tiny-300k"
    config.distill.num_problems = 960
    config.distill.num_samples = 8
    config.distill.sample_batch_size = 256
    config.distill.max_new_tokens = config.eval_base.max_new_tokens
    config.distill.steps = 120
    config.distill.batch_size = 64
    config.distill.lr = 1e-3
    config.stages = "eval_base,distill,eval_final"
    return config
