"""Stage runners: pretrain, sft, eval and rl (the R1 stages extend this registry)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from grpo_jax import evals as evals_lib
from grpo_jax import tasks as tasks_lib
from grpo_jax.pipeline import Run, StageSpec, register_stage
from grpo_jax.rl.algorithms import compute_advantages, get_algorithm
from grpo_jax.rl.reward_sources import resolve_reward_fns
from grpo_jax.rl.rollout import rollout
from grpo_jax.rl.update import LossSettings, build_batch, make_logp_fn, make_train_step
from grpo_jax.sampling import SamplingConfig
from grpo_jax.tasks.data import prompt_iterator
from grpo_jax.sft.data import encode_pairs, epoch_batches
from grpo_jax.sft.loss import make_supervised_step
from grpo_jax.training import init_opt_state, make_optimizer


def _optimizer(run: Run, section, steps: int):
    o = run.config.optim
    return make_optimizer(lr=section.lr, steps=steps, warmup_frac=o.warmup_frac,
                          final_lr_frac=o.final_lr_frac, weight_decay=o.weight_decay,
                          b1=o.b1, b2=o.b2, clip_norm=o.clip_norm)


def _progress(stage: StageSpec, total: int, initial: int):
    return tqdm(total=total, initial=initial, desc=f"{stage.name}", leave=False,
                mininterval=2.0, disable=None)


def prompt_text(run: Run, example) -> str:
    return tasks_lib.apply_template(example, template=run.config.task.template)


def sampling_config(run: Run, *, max_new_tokens: int, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_ids=(run.tokenizer.eos_id,),
        pad_id=run.tokenizer.pad_id,
    )


# ---------------------------------------------------------------------------------------
# Supervised stages: next-token pretraining and SFT


def pretraining_corpus(run: Run, num_rows: int, *, seed: int):
    """Noisy worked solutions of training problems: (prompts, completions)."""
    task, cfg = run.task, run.config.task
    examples = task.examples("train", num_rows, seed=seed)
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for ex in examples:
        completion, _ = task.solution(ex, rng=rng, error_rate=cfg.solution_error_rate,
                                      format_error_rate=cfg.format_error_rate)
        prompts.append(prompt_text(run, ex))
        completions.append(completion)
    return prompts, completions


def supervised_stage(run: Run, stage: StageSpec, prompts, completions, *,
                     loss_on_prompt: bool) -> None:
    """Trains `run.params` on the (prompt, completion) rows for section.steps steps."""
    section = stage.section
    data = encode_pairs(run.tokenizer, prompts, completions,
                        max_len=run.config.model.max_seq_len, loss_on_prompt=loss_on_prompt)
    optimizer, schedule = _optimizer(run, section, section.steps)
    opt_state = init_opt_state(optimizer, run.params, run.mesh)
    start = 0
    if stage.resume_meta is not None:
        state = run.restore_stage({"params": run.params, "opt_state": opt_state})
        run.params, opt_state = state["params"], state["opt_state"]
        start = int(stage.resume_meta["stage_step"])
    step_fn = make_supervised_step(run.policy, optimizer, micro_batches=section.micro_batches)
    every = int(section.get("checkpoint_every", 0) or 0)
    bar = _progress(stage, section.steps, start)
    for step in range(start, section.steps):
        t0 = time.time()
        rows = epoch_batches(len(data["tokens"]), section.batch_size, step,
                             seed=run.config.seed + stage.index)
        batch = jax.device_put({k: v[rows] for k, v in data.items()}, run.data_sharding)
        run.params, opt_state, metrics = step_fn(run.params, opt_state, batch)
        metrics = jax.device_get(metrics)
        run.global_step += 1
        run.writer.write(run.global_step, {
            "stage_step": step + 1,
            "loss": float(metrics["loss"]),
            "grad_norm": float(metrics["grad_norm"]),
            "learning_rate": float(schedule(step)),
            "step_time_s": time.time() - t0,
        }, stage=stage.name)
        bar.update(1)
        bar.set_postfix(loss=f"{float(metrics['loss']):.3f}")
        if every and (step + 1) % every == 0 and step + 1 < section.steps:
            run.save(stage, {"params": run.params, "opt_state": opt_state},
                     stage_step=step + 1, done=False)
    bar.close()
    run.finish_stage(stage, section.steps)


@register_stage("pretrain")
def pretrain_stage(run: Run, stage: StageSpec) -> None:
    """Next-token pretraining on noisy worked solutions (loss on every token)."""
    section = stage.section
    rows = section.get("corpus_size", 0) or section.steps * section.batch_size
    prompts, completions = pretraining_corpus(run, rows, seed=run.config.seed + 1000 * stage.index)
    supervised_stage(run, stage, prompts, completions, loss_on_prompt=True)


@register_stage("sft")
def sft_stage(run: Run, stage: StageSpec) -> None:
    """SFT on clean worked solutions with a completion-only loss (cold start)."""
    section = stage.section
    task = run.task
    examples = task.examples("train", section.num_examples, seed=run.config.seed + 1000 * stage.index)
    rng = np.random.default_rng(run.config.seed + stage.index)
    prompts, completions = [], []
    for ex in examples:
        completion, _ = task.solution(ex, rng=rng, error_rate=section.get("error_rate", 0.0),
                                      format_error_rate=0.0)
        prompts.append(prompt_text(run, ex))
        completions.append(completion)
    supervised_stage(run, stage, prompts, completions, loss_on_prompt=False)


# ---------------------------------------------------------------------------------------
# Evaluation


def sample_and_score(run: Run, examples, *, num_samples: int, batch_size: int,
                     sampling: SamplingConfig, key, weights=None):
    """Samples `num_samples` completions per example in fixed-size batches; per-sample dicts."""
    flat = [ex for ex in examples for _ in range(num_samples)]
    reward_fns = run.task.reward_fns()
    weights = weights or {name: 1.0 for name in reward_fns}
    records = []
    for start in range(0, len(flat), batch_size):
        chunk = flat[start:start + batch_size]
        real = len(chunk)
        chunk = chunk + [chunk[0]] * (batch_size - real)  # static shape: pad with copies
        ro = rollout(run.policy, run.params, run.tokenizer, chunk,
                     [prompt_text(run, ex) for ex in chunk], jax.random.fold_in(key, start),
                     sampling=sampling, prompt_len=run.config.task.prompt_len,
                     reward_fns=reward_fns, weights=weights)
        for i in range(real):
            records.append({
                "example": chunk[i],
                "text": ro.texts[i],
                "length": int(ro.lengths[i]),
                "components": {k: float(v[i]) for k, v in ro.components.items()},
                "reward": float(ro.rewards[i]),
            })
    return records


@register_stage("eval")
def eval_stage(run: Run, stage: StageSpec) -> None:
    """pass@1, pass@k, maj@k, format rate and length on held-out problems."""
    section = stage.section
    task = run.task
    examples = task.examples("test", run.config.task.eval_size, seed=run.config.seed)
    sampling = sampling_config(run, max_new_tokens=run.config.rl.max_new_tokens,
                               temperature=section.temperature)
    t0 = time.time()
    records = sample_and_score(run, examples, num_samples=section.num_samples,
                               batch_size=section.batch_size, sampling=sampling,
                               key=run.stage_key(stage.index, 0))
    per_problem = []
    for start in range(0, len(records), section.num_samples):
        group = records[start:start + section.num_samples]
        per_problem.append({"difficulty": group[0]["example"].difficulty, "samples": [{
            "answer": task.extract_answer(r["text"]),
            "correct": r["components"]["accuracy"] >= 1.0,
            "formatted": r["components"]["format"] >= 1.0,
            "length": r["length"],
        } for r in group]})
    k = section.num_samples
    figures = evals_lib.evaluate_samples(per_problem, ks=sorted({1, k}),
                                         maj_ks=(k,) if k > 1 else ())
    figures["eval_time_s"] = time.time() - t0
    run.evals[stage.name] = figures
    flat = {k: v for k, v in figures.items() if isinstance(v, (int, float))}
    run.writer.write(run.global_step, flat, stage=stage.name)
    print(f"[grpo_jax] {stage.name}: " + ", ".join(
        f"{k}={v:.3f}" for k, v in flat.items()), flush=True)
    run.finish_stage(stage)


# ---------------------------------------------------------------------------------------
# Reinforcement learning


def _dapo_default(section, field: str) -> bool:
    """Resolves an "auto" | "on" | "off" switch whose auto value is on for dapo only."""
    setting = section.get(field, "auto")
    if setting == "auto":
        return section.algorithm == "dapo"
    return setting == "on"


def loss_settings(run: Run, section, *, on_policy: bool) -> LossSettings:
    """Static loss settings of an rl section (DAPO defaults to clip-higher 0.28)."""
    algorithm = get_algorithm(section.algorithm)
    epsilon_high = section.epsilon_high if section.epsilon_high >= 0 else None
    if epsilon_high is None and section.algorithm == "dapo":
        epsilon_high = 0.28  # clip-higher value of the DAPO paper (Yu et al., 2025)
    return LossSettings(
        epsilon=section.epsilon,
        epsilon_high=epsilon_high,
        dual_clip=section.dual_clip if section.dual_clip > 0 else None,
        ratio_level=section.ratio_level,
        beta=section.beta,
        kl_kind=section.kl_kind,
        loss_agg=algorithm.default_loss_agg if section.loss_agg == "auto" else section.loss_agg,
        on_policy=on_policy,
        temperature=section.temperature,
    )


def _combine_rollouts(parts, take):
    """A Rollout whose every field is `take` (a function of the parts' field values)."""
    import dataclasses as dc

    out = {}
    for field in dc.fields(parts[0]):
        values = [getattr(p, field.name) for p in parts]
        if field.name == "components":
            out[field.name] = {k: take([v[k] for v in values]) for k in values[0]}
        elif field.name == "texts":
            out[field.name] = list(take([np.asarray(v, dtype=object) for v in values]))
        else:
            out[field.name] = take(values)
    return type(parts[0])(**out)


def _concat_rollouts(parts):
    """Concatenates Rollouts row-wise."""
    return _combine_rollouts(parts, np.concatenate)


def _take_rows(ro, rows):
    """The Rollout restricted to `rows`."""
    rows = np.asarray(rows, int)
    return _combine_rollouts([ro], lambda values: values[0][rows])


def collect_rollout(run: Run, stage: StageSpec, iterator, step: int, *, sampling, weights,
                    reward_fns, dynamic: bool):
    """One batch of N groups of G scored completions.

    With dynamic sampling (DAPO), groups whose rewards are all equal (zero advantage, no
    gradient) are dropped and more prompts are sampled, for at most `max_sampling_rounds`
    rounds; if the batch is still short, the remaining groups are filled with fully masked
    rows (they carry no loss) so the update keeps its compiled shape.

    Returns (rollout, examples, info dict).
    """
    section = stage.section
    n, g = section.num_prompts, section.group_size
    cfg = run.config
    kept, kept_examples, rounds, dropped = [], [], 0, 0
    while True:
        batch_examples = [ex for ex in next(iterator) for _ in range(g)]
        key = jax.random.fold_in(run.stage_key(stage.index, step), rounds)
        ro = rollout(run.policy, run.params, run.tokenizer, batch_examples,
                     [prompt_text(run, ex) for ex in batch_examples], key, sampling=sampling,
                     prompt_len=cfg.task.prompt_len, reward_fns=reward_fns, weights=weights)
        if section.get("overlong_cache", 0) > 0:
            from grpo_jax.rewards import overlong_penalty

            penalty = overlong_penalty(ro.lengths, max_length=section.max_new_tokens,
                                       cache_length=section.overlong_cache)
            ro.components["overlong"] = penalty
            ro.rewards = ro.rewards + np.float32(weights.get("overlong", 1.0)) * penalty
        rounds += 1
        if not dynamic:
            return ro, batch_examples, {"sampling_rounds": 1}
        groups = ro.rewards.reshape(n, g)
        good = np.flatnonzero(groups.std(axis=1) > 0)
        dropped += n - len(good)
        have = sum(len(k.rewards) for k in kept) // g
        good = good[: n - have]
        if len(good):
            rows = (good[:, None] * g + np.arange(g)[None]).reshape(-1)
            kept.append(_take_rows(ro, rows))
            kept_examples.extend(batch_examples[i] for i in rows)
        have += len(good)
        if have == n or rounds >= section.max_sampling_rounds:
            break
    filled = n - have
    if filled:
        # Masked filler rows: copies of the last batch's first rows with no loss mask.
        filler = _take_rows(ro, np.arange(filled * g))
        filler.mask = np.zeros_like(filler.mask)
        filler.rewards = np.zeros_like(filler.rewards)
        kept.append(filler)
        kept_examples.extend(batch_examples[: filled * g])
    merged = _concat_rollouts(kept) if len(kept) > 1 else kept[0]
    return merged, kept_examples, {"sampling_rounds": rounds, "dropped_groups": dropped,
                                   "filled_groups": filled}


@register_stage("rl")
def rl_stage(run: Run, stage: StageSpec) -> None:
    """GRPO-family iterations: sample G per prompt -> rewards -> advantages -> mu passes."""
    section = stage.section
    cfg = run.config
    task = run.task
    n, g = section.num_prompts, section.group_size
    updates_per_step = section.num_iterations * section.num_minibatches
    optimizer, schedule = _optimizer(run, section, section.steps * updates_per_step)
    opt_state = init_opt_state(optimizer, run.params, run.mesh)
    state = {"params": run.params, "opt_state": opt_state}
    if section.beta != 0.0:
        state["ref_params"] = jax.tree.map(jnp.copy, run.params)
    train_examples = task.examples("train", cfg.task.train_size, seed=cfg.seed)
    iterator = prompt_iterator(train_examples, batch_size=n, seed=cfg.seed + stage.index)
    start = 0
    if stage.resume_meta is not None:
        state = run.restore_stage(state)
        iterator.set_state(stage.resume_meta["data_state"])
        start = int(stage.resume_meta["stage_step"])
    run.params, opt_state = state["params"], state["opt_state"]
    ref_params = state.get("ref_params")

    on_policy = updates_per_step == 1
    settings = loss_settings(run, section, on_policy=on_policy)
    prompt_len = cfg.task.prompt_len
    train_step = make_train_step(run.policy, optimizer, settings, prompt_len=prompt_len,
                                 micro_batches=section.micro_batches)
    logp_fn = make_logp_fn(run.policy, prompt_len=prompt_len, temperature=section.temperature)
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens,
                               temperature=section.temperature, top_k=section.top_k,
                               top_p=section.top_p)
    weights = dict(section.rewards.to_dict())
    reward_fns = resolve_reward_fns(run, weights, section=section)
    score_weights = {k: v for k, v in weights.items() if k != "overlong"}
    dynamic = _dapo_default(section, "dynamic_sampling")
    overlong_filter = _dapo_default(section, "overlong_filter")
    ref_reset = section.get("ref_reset_every", 0)
    bar = _progress(stage, section.steps, start)
    for step in range(start, section.steps):
        t0 = time.time()
        if ref_params is not None and ref_reset and step > 0 and step % ref_reset == 0:
            ref_params = jax.tree.map(jnp.copy, run.params)  # reference reset (DeepSeek-R1)
        ro, examples, info = collect_rollout(run, stage, iterator, step, sampling=sampling,
                                             weights=score_weights, reward_fns=reward_fns,
                                             dynamic=dynamic)
        correct = ro.components.get("accuracy", ro.rewards) >= 1.0
        advantages = compute_advantages(ro.rewards, algorithm=section.algorithm, group_size=g,
                                        correct=correct, eps=section.adv_eps)
        batch = jax.device_put(build_batch(ro, advantages), run.data_sharding)
        if overlong_filter:
            # Overlong filtering (DAPO): truncated completions carry no loss.
            batch["completion_mask"] = batch["completion_mask"] & ~jnp.asarray(ro.truncated)[:, None]
        if ref_params is not None:
            batch["ref_logp"] = logp_fn(ref_params, batch["tokens"], batch["attention_mask"])
        if not on_policy:
            batch["old_logp"] = logp_fn(run.params, batch["tokens"], batch["attention_mask"])
        t_sample = time.time() - t0
        update_metrics = []
        rows = n * g
        per_mb = rows // section.num_minibatches
        for it in range(section.num_iterations):
            order = np.random.default_rng([cfg.seed, stage.index, step, it]).permutation(rows)
            for mb in range(section.num_minibatches):
                idx = order[mb * per_mb:(mb + 1) * per_mb] if section.num_minibatches > 1 else slice(None)
                mb_batch = jax.tree.map(lambda x: x[idx], batch)
                run.params, opt_state, m = train_step(run.params, opt_state, mb_batch)
                update_metrics.append(m)
        m = jax.device_get(jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *update_metrics))
        groups = ro.rewards.reshape(n, g)
        record = {
            "stage_step": step + 1,
            "reward_mean": float(ro.rewards.mean()),
            "reward_std": float(ro.rewards.std()),
            **{f"reward/{k}": float(v.mean()) for k, v in ro.components.items()},
            "pass@1": float(correct.mean()),
            "zero_std_groups": float((groups.std(axis=1) == 0).mean()),
            "completion_length": float(ro.lengths.mean()),
            "truncated_frac": float(ro.truncated.mean()),
            "loss": float(m["loss"]),
            "clip_frac": float(m["clip_frac"]),
            "entropy": float(m["entropy"]),
            "grad_norm": float(m["grad_norm"]),
            "learning_rate": float(schedule(step * updates_per_step)),
            "sample_time_s": t_sample,
            "step_time_s": time.time() - t0,
            **info,
        }
        if "kl" in m:
            record["kl"] = float(m["kl"])
        run.global_step += 1
        run.writer.write(run.global_step, record, stage=stage.name)
        bar.update(1)
        bar.set_postfix(reward=f"{record['reward_mean']:.3f}", acc=f"{record['pass@1']:.2f}")
        every = section.checkpoint_every
        if every and (step + 1) % every == 0 and step + 1 < section.steps:
            ckpt_state = {"params": run.params, "opt_state": opt_state}
            if ref_params is not None:
                ckpt_state["ref_params"] = ref_params
            run.save(stage, ckpt_state, stage_step=step + 1, done=False,
                     data_state=iterator.get_state())
    bar.close()
    run.finish_stage(stage, section.steps)


# ---------------------------------------------------------------------------------------
# Report


def write_run_report(run: Run) -> dict:
    """report.md / report.json / plots: one column per eval stage, RL curves over steps.

    The first eval stage is the "before" column and the last the "after" column; evals in
    between keep their stage names, in run order.
    """
    names = [n for n in run.stage_names if n in run.evals]
    summary = {}
    for i, n in enumerate(names):
        column = "before" if i == 0 else "after" if i == len(names) - 1 else n
        summary[column] = run.evals[n]
    rows = evals_lib.load_history(run.writer.path)
    history = [r for r in rows if r.get("stage") in
               {s for s in run.stage_names if run.config[s].kind in RL_STAGE_KINDS}]
    if not summary and rows:  # no eval stage: report the last logged step
        summary["last_step"] = {k: v for k, v in rows[-1].items()
                                if isinstance(v, (int, float)) and k != "wall_time"}
    if not summary:
        return summary
    evals_lib.write_report(
        run.workdir, title=f"grpo_jax run: {run.config.task.name}", summary=summary,
        history=history,
        plots=("reward_mean", "pass@1", "reward/format", "completion_length", "kl", "clip_frac"),
        step_key="stage_step",
    )
    return summary


# The PPO / TRPO / reward-model / R1 stage kinds register themselves on import.
from grpo_jax import extra_stages  # noqa: E402,F401
from grpo_jax.extra_stages import RL_STAGE_KINDS  # noqa: E402
