"""Stage kind "reward_model": a Bradley-Terry reward model on correct-vs-incorrect worked
solutions, saved to `<workdir>/<stage name>/`; it provides the reward "reward_model" to any
later RL section that names it (with `<section>.reward_model = "<this stage's name>"`).

It checkpoints and resumes as the other training loops do (`Run.save_if_due`): on SIGTERM /
SIGINT a checkpoint of the step (the run's parameters, the reward model's and its optimizer
state) and a stop, and after its last step when it is the run's extendable stage; the same
command continues from there to the same reward model.
"""

from __future__ import annotations

import functools

import jax
import ml_collections
import numpy as np
from flax import nnx

from grpo_jax import parallel, storage
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.models import Transformer
from grpo_jax.rl import reward_model as rm
from grpo_jax.runner import StageKind
from grpo_jax.runner.guards import SkipCounter
from grpo_jax.runner.toolkit import (StepTimer, device_batch, log_step, progress, prompt_text,
                                     stage_optimizer, stage_record_step)
from grpo_jax.sft.data import epoch_batches
from grpo_jax.training import init_opt_state


# The reward model's parameters in the run's checkpoints (beside the run's own "params").
REWARD_MODEL_STATE = "reward_model_params"


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "reward_model" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "reward_model"
    s.num_pairs = 512  # training preference pairs (one per training problem)
    s.eval_pairs = 64  # held-out pairs (test split) for pair accuracy
    s.init = "policy"  # policy: start from the run's current params | scratch: fresh init
    s.steps = 100  # optimizer steps
    s.batch_size = 16  # pairs per step
    s.micro_batches = 1  # gradient accumulation
    s.lr = 1e-3
    return s


def validate(check) -> None:
    for field in ("num_pairs", "eval_pairs", "steps", "batch_size"):
        check.integer(field)
    check.choice("init", ("policy", "scratch"))
    check.positive("lr")
    check.divides("batch_size", check.section.batch_size)


def load(run, source: str) -> rm.RewardModel:
    """The reward model a "reward_model" stage saved (`source`: its stage name or a dir)."""
    return rm.load_reward_model(rm.reward_model_dir(run.workdir, source), run.model_config,
                                run.tokenizer, seq_len=run.config.model.max_seq_len,
                                prompt_fn=functools.partial(prompt_text, run))


def reward_source(run, section):
    """The "reward_model" reward of an RL section: the model saved at its `reward_model`."""
    return load(run, section.reward_model).reward_fn()


def _pair_arrays(run, pairs):
    prompts = [prompt_text(run, ex) for ex, _, _ in pairs]
    seq_len = run.config.model.max_seq_len
    ct, cm = rm.encode_texts(run.tokenizer, prompts, [c for _, c, _ in pairs], seq_len=seq_len)
    rt, rmask = rm.encode_texts(run.tokenizer, prompts, [r for _, _, r in pairs],
                                seq_len=seq_len)
    return rm.PairBatch(chosen_tokens=ct, chosen_mask=cm, rejected_tokens=rt,
                        rejected_mask=rmask)


def run_reward_model(run, stage) -> None:
    """Trains a Bradley-Terry reward model; saves it to <workdir>/<stage name>/."""
    section, cfg = stage.section, run.config
    train = rm.preference_pairs(
        run.task, run.task.examples("train", section.num_pairs,
                                    seed=run.stage_seed(stage.name, "problems")),
        seed=run.stage_seed(stage.name, "pairs"))
    held = rm.preference_pairs(
        run.task, run.task.examples("test", section.eval_pairs,
                                    seed=run.stage_seed(stage.name, "held_out_problems")),
        seed=run.stage_seed(stage.name, "held_out_pairs"))
    if len(train) < section.batch_size:
        raise ValueError(f"{stage.name}.num_pairs: only {len(train)} preference pairs could be "
                         f"built, fewer than batch_size {section.batch_size}")
    data = _pair_arrays(run, train)
    if section.init == "policy":
        policy = rm.scalar_head_policy(run.model_config,
                                       batch_streams=run.policy.batch_streams)
        params = rm.add_scalar_head(run.params)
    else:  # a fresh model with a scalar head, placed on the mesh like the run's own
        policy, params = run.place_model(Transformer(
            run.model_config.replace(value_head=True),
            rngs=nnx.Rngs(run.stage_seed(stage.name, "init"))))
    optimizer, schedule = stage_optimizer(run, lr=section.lr, steps=section.steps)
    opt_state = init_opt_state(optimizer, params, run.mesh)
    start = 0
    if stage.resume_meta is not None:  # a checkpoint of this stage's step `start`
        state = run.restore_stage({"params": run.params, REWARD_MODEL_STATE: params,
                                   "opt_state": opt_state})
        run.params, params, opt_state = (state["params"], state[REWARD_MODEL_STATE],
                                         state["opt_state"])
        start = int(stage.resume_meta["stage_step"])
    step_fn = rm.make_reward_model_step(policy, optimizer, micro_batches=section.micro_batches)
    batch_seed = run.stage_seed(stage.name, "batches")
    skips = SkipCounter(cfg.max_consecutive_skips)
    bar = progress(stage, section.steps, start)
    for step in range(start, section.steps):
        timer = StepTimer()
        rows = epoch_batches(len(train), section.batch_size, step, seed=batch_seed)
        batch = device_batch(run, data.take(rows))
        params, opt_state, m = step_fn(params, opt_state, batch)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        log_step(run, stage, {
            "stage_step": step + 1, "loss": m["loss"], "pair_accuracy": m["pair_accuracy"],
            "margin": m["margin"], "grad_norm": m["grad_norm"],
            "learning_rate": float(schedule(step)), **skips.count(m), **timer.record()},
            bar, loss="loss")
        skips.check(stage.name, step + 1)
        # every=0: the stage has no checkpoint_every field (adding one would change the
        # config hashes of finished runs); it saves on a stop and at the extendable end
        run.save_if_due(stage, {"params": run.params, REWARD_MODEL_STATE: params,
                                "opt_state": opt_state},
                        stage_step=step + 1, total=section.steps, every=0)
    bar.close()
    record = {"train_pairs": len(train), "eval_pairs": len(held)}
    if held:
        model = rm.RewardModel(policy, params, run.tokenizer, seq_len=cfg.model.max_seq_len,
                               prompt_fn=functools.partial(prompt_text, run),
                               batch_size=section.batch_size)
        chosen = model.score([c for _, c, _ in held], [ex for ex, _, _ in held])
        rejected = model.score([r for _, _, r in held], [ex for ex, _, _ in held])
        record["eval_pair_accuracy"] = float(np.mean(chosen > rejected))
        record["eval_margin"] = float(np.mean(chosen - rejected))
    run.writer.write(stage_record_step(run), record, stage=stage.name)
    print(f"[grpo_jax] {stage.name}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float)
                                                   else f"{k}={v}" for k, v in record.items()),
          flush=True)
    out_dir = storage.join(run.workdir, stage.name)
    if parallel.is_primary():
        storage.rmtree(out_dir)  # a rerun after a crash overwrites it
    parallel.sync("grpo_jax: reward model directory cleared")
    with Checkpointer(out_dir, max_to_keep=1, async_=False) as ckpt:
        ckpt.save(0, state={"params": params}, meta=record, force=True)
    run.finish_stage(stage, section.steps)


KIND = StageKind("reward_model", run_reward_model, default_section, validate,
                 reward_sources={rm.REWARD_MODEL_REWARD: reward_source},
                 description="Bradley-Terry reward model (provides the 'reward_model' reward)")
