"""Supervised training shared by pretrain, sft, rejection_sft and distill: the next-token
loop over (prompt, completion) rows, and the verified-sample rows of the R1 stages."""

from __future__ import annotations

import json

import jax
import ml_collections
import numpy as np

from grpo_jax import parallel, storage
from grpo_jax.sft.data import encode_pairs, epoch_batches, pack_rows, packed_rows_for
from grpo_jax.sft.loss import make_supervised_step
from grpo_jax.sft.verified import fill_rows, select_verified
from grpo_jax.runner.fields import SUPERVISED, declare
from grpo_jax.runner.guards import SkipCounter
from grpo_jax.runner.rollouts import sample_and_score
from grpo_jax.runner.toolkit import (StepTimer, device_batch, log_step, progress, prompt_text,
                                     sampling_config, stage_optimizer, stage_record_step)
from grpo_jax.training import init_opt_state


def train_supervised(run, stage, prompts, completions, *, loss_on_prompt: bool) -> None:
    """Trains `run.params` on the (prompt, completion) rows for section.steps steps (lr,
    batch_size, micro_batches and checkpoint_every from the section) and ends the stage.
    The spans of a completion the task's environment writes (`Task.observations`, e.g. a
    tool's answer) are attended to and out of the loss, as in RL."""
    section = stage.section
    try:
        data = encode_pairs(run.tokenizer, prompts, completions,
                            seq_len=section.pack_len or None,
                            max_len=run.config.model.max_seq_len, loss_on_prompt=loss_on_prompt,
                            observations=run.task.observations)
    except ValueError as e:
        if not section.pack_len:
            raise
        raise ValueError(f"{stage.name}.pack_len: {e}; raise pack_len (<= model.max_seq_len) "
                         "or set it to 0") from None
    batch_rows = lambda step: epoch_batches(data.rows, section.batch_size, step,
                                            seed=run.stage_seed(stage.name, "batches"))
    num_rows = packed_rows(run, stage, data, batch_rows) if section.pack_len else None
    optimizer, schedule = stage_optimizer(run, lr=section.lr, steps=section.steps)
    opt_state = init_opt_state(optimizer, run.params, run.mesh)
    start = 0
    if stage.resume_meta is not None:
        state = run.restore_stage({"params": run.params, "opt_state": opt_state})
        run.params, opt_state = state["params"], state["opt_state"]
        start = int(stage.resume_meta["stage_step"])
    step_fn = make_supervised_step(run.policy, optimizer, micro_batches=section.micro_batches)
    skips = SkipCounter(run.config.max_consecutive_skips)
    bar = progress(stage, section.steps, start)

    def host_batch(step):
        batch = data.take(batch_rows(step))
        return batch if num_rows is None else pack_rows(batch, num_rows)

    batch = host_batch(start) if start < section.steps else None
    for step in range(start, section.steps):
        timer = StepTimer()
        tokens = float(np.sum(batch.loss_mask))  # the target tokens the step trains on
        run.params, opt_state, metrics = step_fn(run.params, opt_state, device_batch(run, batch))
        if step + 1 < section.steps:  # the next batch on the host while the step runs
            batch = host_batch(step + 1)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        log_step(run, stage, {
            "stage_step": step + 1,
            "loss": metrics["loss"],
            "grad_norm": metrics["grad_norm"],
            "learning_rate": float(schedule(step)),
            "tokens": tokens,
            **skips.count(metrics),
            **timer.record(),
        }, bar, loss="loss")
        skips.check(stage.name, step + 1)
        run.save_if_due(stage, {"params": run.params, "opt_state": opt_state},
                        stage_step=step + 1, total=section.steps,
                        every=section.checkpoint_every)
    bar.close()
    run.finish_stage(stage, section.steps)


def packed_rows(run, stage, data, batch_rows) -> int:
    """Rows of section.pack_len tokens that every step's batch packs into (the most any step
    needs, rounded up to micro_batches x data-parallel devices): one shape, compiled once."""
    section = stage.section
    lengths = data.attention_mask.sum(axis=1)
    rows = packed_rows_for(lengths, map(batch_rows, range(section.steps)), section.pack_len,
                           multiple=section.micro_batches * parallel.data_parallel_size(run.mesh))
    unpacked = section.batch_size * min(-(-int(lengths.max()) // 8) * 8,
                                        run.config.model.max_seq_len)  # as encode_pairs pads
    print(f"[grpo_jax] {stage.name}: {section.batch_size} examples per step packed into "
          f"{rows} rows of {section.pack_len} tokens ({rows * section.pack_len} positions, "
          f"{unpacked} unpacked)", flush=True)
    return rows


def clean_solutions(run, num: int, *, seed: int, error_rate: float = 0.0):
    """`num` worked solutions of training problems (clean unless `error_rate`):
    (prompts, completions)."""
    if num <= 0:
        return [], []
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for ex in run.task.examples("train", num, seed=seed):
        text, _ = run.task.solution(ex, rng=rng, error_rate=error_rate, format_error_rate=0.0)
        prompts.append(prompt_text(run, ex))
        completions.append(text)
    return prompts, completions


def sample_verified(run, stage, policy, params, *, seed: int):
    """Samples section.num_samples per training problem with (policy, params) and keeps the
    verified-correct, well-formed ones: (prompts, completions, info)."""
    section = stage.section
    examples = run.task.examples("train", section.num_problems, seed=seed)
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens,
                               temperature=section.temperature)
    records = sample_and_score(run, examples, num_samples=section.num_samples,
                               batch_size=section.sample_batch_size, sampling=sampling,
                               key=run.stage_key(stage.name, 0), policy=policy, params=params)
    kept = select_verified(records, min_accuracy=section.min_accuracy,
                           min_format=section.min_format, dedupe=section.dedupe)
    info = {"sampled": len(records), "kept": len(kept),
            "kept_frac": len(kept) / max(len(records), 1),
            "problems_covered": len({getattr(r["example"], "id", i) for i, r in
                                     enumerate(kept)})}
    return ([prompt_text(run, r["example"]) for r in kept], [r["text"] for r in kept], info)


def stage_rows(run, stage, sample):
    """The stage's (prompts, completions, info): read from `<workdir>/<stage>/data.jsonl`
    when an earlier attempt of the stage saved them, else `sample()` and saved, so a resumed
    stage trains on the same rows (its sampling model may be gone by then)."""
    path = storage.join(run.workdir, stage.name, "data.jsonl")
    if storage.exists(path):
        lines = [json.loads(line) for line in storage.read_text(path).split("\n")
                 if line.strip()]
        return ([r["prompt"] for r in lines[1:]], [r["completion"] for r in lines[1:]],
                lines[0]["info"])
    prompts, completions, info = sample()
    if parallel.is_primary():  # every process sampled the same rows; process 0 keeps them
        storage.makedirs(storage.join(run.workdir, stage.name))
        lines = [json.dumps({"info": info})] + [
            json.dumps({"prompt": p, "completion": c}) for p, c in zip(prompts, completions)]
        storage.write_text(path, "".join(line + "\n" for line in lines))  # atomic
    return prompts, completions, info


def train_on_rows(run, stage, prompts, completions, info) -> None:
    """Logs the selection `info` (once: not again when the stage resumes), then fine-tunes
    on the rows (completion tokens only)."""
    if stage.resume_meta is None:
        run.writer.write(stage_record_step(run), {k: float(v) for k, v in info.items()},
                         stage=stage.name)
    print(f"[grpo_jax] {stage.name}: " + ", ".join(f"{k}={v}" for k, v in info.items()),
          flush=True)
    if not prompts:
        print(f"[grpo_jax] {stage.name}: no verified completions and no mixed-in data; "
              "skipping training", flush=True)
        run.finish_stage(stage)
        return
    prompts, completions = fill_rows(prompts, completions, stage.section.batch_size)
    train_supervised(run, stage, prompts, completions, loss_on_prompt=False)


# The field groups of rejection_sft and distill sections (`verified_sampling_fields`).
VERIFIED_GROUPS = (SUPERVISED,)


def verified_sampling_fields(s: ml_collections.ConfigDict) -> None:
    """Fields of rejection_sft and distill sections: what to sample, what to keep, and the
    supervised group (how to fine-tune on what was kept)."""
    s.num_problems = 256  # training problems to sample from
    s.num_samples = 4  # k completions per problem
    s.temperature = 1.0  # sampling temperature
    s.max_new_tokens = 40  # completion budget when sampling
    s.sample_batch_size = 64  # sequences per sampler call (compile once)
    s.min_accuracy = 1.0  # keep completions with accuracy reward >= this
    s.min_format = 1.0  # ... and strict format reward >= this
    s.dedupe = True  # drop repeated (problem, completion) pairs
    declare(s, *VERIFIED_GROUPS)  # the SFT on the kept rows, with these defaults:
    s.steps = 100  # SFT optimizer steps on the kept rows
    s.batch_size = 32  # SFT rows per step
    s.lr = 1e-3


def validate_verified_sampling(check) -> None:
    """Checks the fields of `verified_sampling_fields` outside its groups (checked
    before)."""
    for field in ("num_problems", "num_samples", "sample_batch_size"):
        check.integer(field)
    check.positive("temperature")
    check.fits_context("max_new_tokens")
    check.number("min_accuracy")
    check.number("min_format")
    check.divides("sample_batch_size", check.section.sample_batch_size, micro_field=None)
