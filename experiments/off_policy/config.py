"""How off-policy can GRPO go: rollouts up to K updates stale, with and without corrections.

The main job's RL stage (configs/default.py: GRPO, accuracy + 0.2 x format reward, lr
2e-4, groups of 8, host rewards), shortened to 60 steps of 16 prompts so that the grid fits
the 2-core machine, run from the final parameters of one shared base run (the main job's
pretraining, seed 0), then the held-out evaluation on problems fixed across seeds
(task.eval_seed). The sweep sets rl.max_staleness (K), rl.off_policy_correction and the
seed; see README.md next to this file for the commands.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import default  # noqa: E402


def get_config(preset=None):
    del preset
    config = default.get_config()
    config.stages = "rl,eval_final"
    del config.pretrain, config.eval_base
    config.rl.steps = 60
    config.rl.num_prompts = 16
    # The base run's workdir (its final parameters, model shape and tokenizer); the sweep
    # passes it with --config.model.init_from=...
    config.model.init_from = ""
    config.rl.fused_steps = 0  # stale rollouts run in the host loop
    return config
