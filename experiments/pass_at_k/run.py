"""The pass@k study's evaluations: the base model and the three RL models, 256 samples per
held-out problem, pass@k for k = 1, 2, 4, ..., 256, one eval-only run each.

    python experiments/pass_at_k/run.py [--root=runs/experiments/pass_at_k] [--print]

Runs, one after another, the evaluations that have not finished (a run is finished when its
report.json exists, so running this again resumes), each into `<root>/model=M,seed=S`:
M = base (the off-policy study's pretrained base, evaluated with sampling seed S) or rl (that
base after 60 GRPO steps with seed S, K = 0 of the off-policy sweep, evaluated with seed S).
The seed sets the sampling keys only; the 128 held-out problems are fixed (task.eval_seed),
so model=rl,seed=S and model=base,seed=S are paired by problem and by key. Each run's wall
time is written to its `wall_s.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SOURCES = os.path.join(REPO, "runs", "experiments", "off_policy")
KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NUM_SAMPLES = 256
SEEDS = (0, 1, 2)


def model_dir(model: str, seed: int) -> str:
    if model == "base":
        return os.path.join(SOURCES, "base")
    return os.path.join(SOURCES, "sweep", f"rl.max_staleness=0,seed={seed}")


def command(model: str, seed: int, workdir: str) -> list[str]:
    return [sys.executable, "-m", "grpo_jax.main", "--config=configs/default.py",
            "--config.stages=eval_final", f"--config.model.init_from={model_dir(model, seed)}",
            f"--workdir={workdir}", f"--config.seed={seed}",
            f"--config.eval_final.num_samples={NUM_SAMPLES}",
            "--config.eval_final.ks=" + ",".join(map(str, KS))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join("runs", "experiments", "pass_at_k"))
    parser.add_argument("--print", action="store_true", dest="print_only",
                        help="print the commands and exit")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    for seed in SEEDS:
        for model in ("base", "rl"):
            workdir = os.path.join(root, f"model={model},seed={seed}")
            cmd = command(model, seed, workdir)
            if args.print_only:
                print(shlex.join(cmd))
                continue
            if os.path.exists(os.path.join(workdir, "report.json")):
                print(f"[pass_at_k] finished: {workdir}", flush=True)
                continue
            if not os.path.isdir(model_dir(model, seed)):
                raise SystemExit(f"{model_dir(model, seed)}: the model to evaluate is missing "
                                 "(experiments/off_policy/README.md makes it)")
            os.makedirs(workdir, exist_ok=True)
            print(f"[pass_at_k] start {workdir}", flush=True)
            t0 = time.time()
            with open(os.path.join(workdir, "run.log"), "a") as log:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=REPO)
            wall = time.time() - t0
            with open(os.path.join(workdir, "wall_s.json"), "w") as f:
                json.dump({"wall_s": wall}, f)
            print(f"[pass_at_k] done {workdir} in {wall:.0f}s", flush=True)


if __name__ == "__main__":
    main()
