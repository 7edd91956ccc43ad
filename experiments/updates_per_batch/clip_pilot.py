"""How often the clip binds in the first steps of an arm: a pilot before the full tier.

Builds (or reuses) the main base of seed 0 under WORKDIR/bases (the full tier's, keyed by
its config as every study's), then for each STUDY:ARM runs that arm's RL stage alone from it
(seed 0, its own learning-rate schedule over all its steps) and stops it after STEPS steps,
printing per step the clip fraction (the share of the tokens of the step's updates where the
clip binds), the training reward and the KL to the reference, and their means.

    python experiments/updates_per_batch/clip_pilot.py /tmp/pilot 12 \\
        "updates_per_batch:mu=4" "updates_per_batch:mu=4, lr=1e-3" \\
        "updates_per_batch:mu=4, lr=4e-3" "spurious_rewards:random, mu=4"

The figures are one base and one seed, in the first steps only (the warmup included): they
say where the clip can act, not what an arm's held-out result will be.
"""

import json
import os
import subprocess
import sys
import time


def _child(study: str, arm: str, base: str, workdir: str) -> None:
    import importlib

    from grpo_jax import pipeline
    from grpo_jax.studies import configs

    module = importlib.import_module(f"grpo_jax.studies.{study}")
    config = configs.for_tier(module.arm_config(arm, "full"), "full")
    config.seed = 0
    config.model.init_from = base
    config.stages = "rl"
    pipeline.train_and_evaluate(config, workdir)


def _rows(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip().endswith("}")]
    return [row for row in rows if "clip_frac" in row]


def main(root: str, steps: int, arms: list[str]) -> None:
    from grpo_jax.studies import common

    _, info = common.build_base(common.for_tier_base(common.main_base("full"), "full"), root, 0)
    for name in arms:
        study, arm = name.split(":", 1)
        workdir = os.path.join(root, "pilot", name.replace(":", "_").replace(", ", "_")
                               .replace(" ", "_"))
        if os.path.exists(workdir):
            sys.exit(f"{workdir} exists: remove it or pass another WORKDIR")
        os.makedirs(workdir)
        with open(workdir + ".log", "w", encoding="utf-8") as log:
            child = subprocess.Popen([sys.executable, __file__, "--child", study, arm,
                                      info["workdir"], workdir], stdout=log,
                                     stderr=subprocess.STDOUT)
            while child.poll() is None and len(_rows(workdir)) < steps:
                time.sleep(5)
            child.kill()
            child.wait()
        rows = _rows(workdir)[:steps]
        if not rows:
            print(f"{name}: no RL step logged (see {workdir}.log)")
            continue
        clip = [row["clip_frac"] for row in rows]
        print(f"{name}: {len(rows)} steps; clip fraction mean {100 * sum(clip) / len(clip):.2f}% "
              f"(max {100 * max(clip):.2f}%); per step "
              + " ".join(f"{100 * c:.1f}" for c in clip) + "; training reward "
              + " ".join(f"{row['reward_mean']:.2f}" for row in rows)
              + f"; KL to the reference at the last {rows[-1].get('kl_ref', float('nan')):.3f}",
              flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:6])
    elif len(sys.argv) < 4 or not sys.argv[2].isdigit():
        sys.exit("usage: python clip_pilot.py WORKDIR STEPS STUDY:ARM [STUDY:ARM ...]")
    else:
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
