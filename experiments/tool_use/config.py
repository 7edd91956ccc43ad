"""Does a tiny model learn to use a calculator with GRPO on multi-turn episodes?

configs/tools.py's job from one shared pretrained base (its `pretrain` stage, seed 0, run
once): evaluate with and without the tool, 60 GRPO steps on episodes with the calculator,
evaluate with and without the tool again. The held-out problems are fixed across seeds
(task.eval_seed); the seed sets the RL prompt order and every sampling key, so the four
evaluations of a seed are paired. See README.md next to this file for the commands.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import tools  # noqa: E402


def get_config(preset=None):
    del preset
    config = tools.get_config()
    config.stages = "eval_base,eval_base_no_tool,rl,eval_final,eval_final_no_tool"
    del config.pretrain
    # The base run's workdir (its final parameters, model shape and tokenizer); the sweep
    # passes it with --config.model.init_from=...
    config.model.init_from = ""
    return config
