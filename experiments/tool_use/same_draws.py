"""The tool job's pretraining and an evaluation with the tool, run in one source tree with
every stage seed and key drawn as at `ea5240e` (from the stage's position in
config.stages), so that two trees of different commits draw alike and their metrics can be
compared row by row (experiments/tool_use/README.md, "Why the bases differ").

    git archive ea5240e | tar -x -C /tmp/ea5240e
    git archive ab14e1d | tar -x -C /tmp/ab14e1d
    (cd /tmp/ea5240e && PYTHONPATH=$PWD python $OLDPWD/experiments/tool_use/same_draws.py \\
        /tmp/same_ea)
    (cd /tmp/ab14e1d && PYTHONPATH=$PWD python $OLDPWD/experiments/tool_use/same_draws.py \\
        /tmp/same_ab --by-position)
    # then compare /tmp/same_ea/metrics.jsonl with /tmp/same_ab/metrics.jsonl

Run from the root of the tree to test, with that root on PYTHONPATH (its grpo_jax and
configs are imported);
`--by-position` replaces `Run.stage_seed` / `Run.stage_key` of a tree whose stages draw by
their name (6d52c19 and later) with the former rule.
"""

import sys
import zlib

import jax
import numpy as np
from configs import tools
from grpo_jax import pipeline
from grpo_jax.runner import run as run_module

STEPS = 150  # the smoke preset's pretraining, longer: the policy calls the tool


def by_position_seed(seed: int, index: int, purpose: str) -> int:
    """derive_seed as at ea5240e: SeedSequence of (seed, stage index, CRC-32 of purpose)."""
    entropy = [int(seed), int(index), zlib.crc32(purpose.encode("utf-8"))]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)


def main(workdir: str, by_position: bool) -> None:
    config = tools.get_config("smoke")
    config.stages = "pretrain,eval_base"
    config.pretrain.steps = STEPS
    config.seed = 0
    names = config.stages.split(",")
    if by_position:
        run_module.Run.stage_seed = lambda self, stage, purpose: by_position_seed(
            self.config.seed, names.index(stage), purpose)
        run_module.Run.stage_key = lambda self, stage, step: jax.random.fold_in(
            jax.random.fold_in(self.key, names.index(stage)), step)
    pipeline.train_and_evaluate(config, workdir)


if __name__ == "__main__":
    if len(sys.argv) < 2 or set(sys.argv[2:]) - {"--by-position"}:
        sys.exit("usage: python same_draws.py WORKDIR [--by-position]")
    main(sys.argv[1], "--by-position" in sys.argv[2:])
