"""The KL-coefficient ablation: GRPO from one shared base model, beta swept by the sweep tool.

The main job's RL stage (configs/default.py: 80 GRPO steps of 32 prompts x 8, accuracy +
0.2 x format reward, lr 2e-4) run from the final parameters of one base run (the main job's
1500 pretraining steps, seed 0), with held-out evaluations before and after. The sweep sets
rl.beta and the seed; see README.md next to this file for the commands.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import default  # noqa: E402


def get_config(preset=None):
    del preset
    config = default.get_config()
    config.stages = "eval_base,rl,eval_final"
    del config.pretrain
    # The base run's workdir (its final parameters, model shape and tokenizer); the sweep
    # passes it with --config.model.init_from=...
    config.model.init_from = ""
    config.rl.fused_steps = 0  # host rewards, as the recorded results were measured
    return config
