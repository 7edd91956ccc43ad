"""Every held-out completion of a run's kept checkpoints (the eval stages log only 4).

The eval stages of the sweep keep 4 generated texts in samples.jsonl (the eval section's
samples_logged), too few for the length of the correct and of the incorrect completions or
the redo rate. This script runs eval-only jobs in-process, from each sweep run's kept
checkpoints (config.py keeps every 20th RL step), with samples_logged -1, and writes all
128 problems x 8 samples to OUT/<run>/step=<k>/eval/samples.jsonl (metrics.jsonl has the
stage's figures; policy/ next to it holds that checkpoint's parameters as a run directory
model.init_from can start from):

    python experiments/length_bias/held_out.py --sweep=runs/experiments/length_bias/sweep \
        --out=runs/experiments/length_bias/held_out

Step 0 is the run's eval_base checkpoint (the base's parameters) evaluated as stage 0 with
the run's seed, so its samples are the sweep's eval_base samples exactly; the last RL step is
evaluated as stage 2 (two one-token padding evals first), so its samples are the sweep's
eval_final samples exactly (the script checks pass@1 against the run's metrics). The steps
in between use stage 0's keys, the same as step 0's (common random numbers along training).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))

from grpo_jax.metrics import read_metrics


def _load_config_module():
    spec = importlib.util.spec_from_file_location("length_bias_config",
                                                  os.path.join(HERE, "config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kept_steps(run_dir: str) -> dict[int, int]:
    """RL stage step -> checkpoint step of the run's kept checkpoints (0: eval_base's)."""
    from grpo_jax.checkpoint import Checkpointer

    found = {}
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as checkpointer:
        for step in checkpointer.all_steps():
            meta = checkpointer.restore_meta(step)
            if meta.get("stage") == "eval_base":
                found[0] = step
            elif meta.get("stage") == "rl":
                found.setdefault(int(meta["stage_step"]), step)
    return found


def policy_view(run_dir: str, checkpoint_step: int, out: str) -> str:
    """A run directory of its own (config.json and one finished checkpoint) holding the
    parameters of checkpoint `checkpoint_step` of `run_dir`, for model.init_from (which
    starts from a run's latest finished-stage checkpoint, and reads parameters only)."""
    from grpo_jax.checkpoint import Checkpointer

    view = os.path.join(out, "policy")
    if os.path.isdir(os.path.join(view, "checkpoints")):
        return view
    os.makedirs(view, exist_ok=True)
    shutil.copy(os.path.join(run_dir, "config.json"), os.path.join(view, "config.json"))
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as source:
        state, meta = source.restore(checkpoint_step)
    meta = {**meta, "stage_done": True, "source_step": checkpoint_step}
    with Checkpointer(os.path.join(view, "checkpoints"), async_=False) as target:
        target.save(checkpoint_step, state={"params": state["params"], "rng": state["rng"]},
                    meta=meta, force=True)
    return view


def evaluate_checkpoint(run_dir: str, checkpoint_step: int, out: str, *, exact_final: bool):
    """Eval-only job in `out` from checkpoint `checkpoint_step` of `run_dir`."""
    from grpo_jax import pipeline

    run_config = json.load(open(os.path.join(run_dir, "config.json"), encoding="utf-8"))
    config = _load_config_module().get_config()
    config.seed = int(run_config["seed"])
    config.model.init_from = os.path.abspath(policy_view(run_dir, checkpoint_step, out))
    config.checkpoint.max_to_keep = 1
    config.eval_base.samples_logged = config.eval_final.samples_logged = -1  # every one
    if exact_final:  # the sweep's eval_final is stage 2 of eval_base,rl,eval_final
        for name in ("pad0", "pad1"):
            config[name] = type(config.eval_base)(config.eval_base.to_dict())
            config[name].num_samples = 1
            config[name].max_new_tokens = 1
        config.stages = "pad0,pad1,eval_final"
        del config.eval_base
    else:
        config.stages = "eval_base"
        del config.eval_final
    del config.rl
    pipeline.train_and_evaluate(config, os.path.join(out, "eval"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the sweep directory")
    parser.add_argument("--out", required=True, help="where the eval-only jobs go")
    parser.add_argument("--every", type=int, default=20, help="RL steps between checkpoints")
    args = parser.parse_args()
    for name in sorted(os.listdir(args.sweep)):
        run_dir = os.path.join(args.sweep, name)
        if not os.path.isfile(os.path.join(run_dir, "report.json")):
            continue
        steps = kept_steps(run_dir)
        last = max(steps)
        for k in sorted(steps):
            if k % args.every and k != last:
                continue
            out = os.path.join(args.out, name, f"step={k}")
            if os.path.isfile(os.path.join(out, "eval", "report.json")):
                continue
            print(f"[held_out] {name} step {k} (checkpoint {steps[k]})", flush=True)
            evaluate_checkpoint(run_dir, steps[k], out, exact_final=k == last)
            if k in (0, last):  # the same samples as the sweep's eval stage: check
                stage = "eval_base" if k == 0 else "eval_final"
                ours = [r for r in read_metrics(os.path.join(out, "eval"))
                        if r.get("stage") == stage][-1]
                theirs = [r for r in read_metrics(run_dir) if r.get("stage") == stage][-1]
                if abs(ours["pass@1"] - theirs["pass@1"]) > 1e-9:
                    print(f"[held_out] warning: {name} {stage} pass@1 {ours['pass@1']:.4f} "
                          f"here, {theirs['pass@1']:.4f} in the sweep", flush=True)


if __name__ == "__main__":
    main()
