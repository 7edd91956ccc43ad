"""The budget-forcing study's evaluations: the three RL models of the off-policy study,
each evaluated with its own seed, without forcing and at each thinking budget.

    python experiments/budget_forcing/run.py [--root=runs/experiments/budget_forcing] [--print]

The second part of the study forces a continuation the models have seen: the GRPO models of
the length_bias study (pretrained on traces that redo steps, `task.kwargs.redo_rate` 0.3),
with " redo" instead of "Wait" and minima only:

    python experiments/budget_forcing/run.py --root=runs/experiments/budget_forcing/redo \
        --models="runs/experiments/length_bias/sweep/rl.algorithm=grpo,seed={seed}" \
        --continuation=" redo" --caps= --minima=16,24,32

Runs, one after another, the evaluations that have not finished (a run is finished when its
report.json exists, so running this again resumes), each an eval-only run of
`runs/experiments/off_policy/sweep/rl.max_staleness=0,seed=S` into
`<root>/<arm>,seed=S`, where <arm> is the one eval_final field set
(`grpo_jax.sweep.Run` names): eval_final.max_thinking_tokens=0 (no forcing),
max_thinking_tokens in CAPS (the end of thinking forced after that many thinking tokens) and
min_thinking_tokens in MINIMA (an earlier end of thinking, or EOS, replaced by "Wait").
Every arm, the unforced one included, uses max_new_tokens = 48 (the most that fits the
64-token context after the 16-token prompt bucket; the forced "Wait" traces need the room),
8 samples per problem and the run's seed, so the arms of a seed share the held-out problems
and the sampling keys and differ only in the forcing. Each run's wall time is written to its
`wall_s.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import time

from grpo_jax import sweep

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

MODELS = os.path.join(REPO, "runs", "experiments", "off_policy", "sweep",
                      "rl.max_staleness=0,seed={seed}")
CAPS = (4, 8, 12, 16)
MINIMA = (24, 32)
SEEDS = (0, 1, 2)
MAX_NEW_TOKENS = 48
NUM_SAMPLES = 8


def arms(caps=CAPS, minima=MINIMA) -> list[tuple[str, int]]:
    return ([("eval_final.max_thinking_tokens", 0)]
            + [("eval_final.max_thinking_tokens", c) for c in caps]
            + [("eval_final.min_thinking_tokens", m) for m in minima])


def runs(root: str, models: str = MODELS, continuation: str = "Wait", caps=CAPS,
         minima=MINIMA) -> list[sweep.Run]:
    out = []
    for seed in SEEDS:
        model = os.path.abspath(models.format(seed=seed))
        extra = ["--config.stages=eval_final", f"--config.model.init_from={model}",
                 f"--config.eval_final.max_new_tokens={MAX_NEW_TOKENS}",
                 f"--config.eval_final.num_samples={NUM_SAMPLES}",
                 f"--config.eval_final.continuation={continuation}"]
        for key, value in arms(caps, minima):
            out.append(sweep.Run([(key, str(value))], seed, root, "configs/default.py", extra))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root",
                        default=os.path.join("runs", "experiments", "budget_forcing"))
    parser.add_argument("--print", action="store_true", dest="print_only",
                        help="print the commands and exit")
    parser.add_argument("--models", default=MODELS,
                        help="the RL runs to evaluate, {seed} standing for the seed")
    parser.add_argument("--continuation", default="Wait",
                        help="the text that replaces an end of thinking before the minimum")
    parser.add_argument("--caps", default=",".join(map(str, CAPS)))
    parser.add_argument("--minima", default=",".join(map(str, MINIMA)))
    args = parser.parse_args()
    budgets = lambda text: tuple(int(v) for v in text.split(",") if v.strip())
    for run in runs(os.path.abspath(args.root), args.models, args.continuation,
                    budgets(args.caps), budgets(args.minima)):
        if args.print_only:
            print(shlex.join(run.command))
            continue
        if run.finished:
            print(f"[budget_forcing] finished: {run.name}", flush=True)
            continue
        os.makedirs(run.workdir, exist_ok=True)
        print(f"[budget_forcing] start {run.name}", flush=True)
        t0 = time.time()
        with open(os.path.join(run.workdir, "run.log"), "a") as log:
            subprocess.run(run.command, stdout=log, stderr=subprocess.STDOUT, check=True,
                           cwd=REPO)
        wall = time.time() - t0
        with open(os.path.join(run.workdir, "wall_s.json"), "w") as f:
            json.dump({"wall_s": wall}, f)
        print(f"[budget_forcing] done {run.name} in {wall:.0f}s", flush=True)


if __name__ == "__main__":
    main()
