"""The one RL loop every RL stage kind (the GRPO family, PPO, TRPO) runs.

    prompts -> rollout (sample, decode, score) -> device batch on the data mesh
            -> the kind's `Learner.iterate` (advantages, losses, updates)
            -> the shared record -> log -> checkpoint when due

A kind supplies a `Learner`: its checkpointed state (a pytree whose "params" is the
policy), its `iterate`, and optional host-side state kept in checkpoint meta (e.g. PPO's
adaptive KL coefficient). Everything else (the prompt iterator and its resume, sampling
keys, dynamic sampling, rewards, the core metrics, checkpoints) is here, once.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rewards.accuracy import undecided_comparisons
from grpo_jax.rl.batch import RolloutBatch, rollout_batch, rollout_record
from grpo_jax.rl.rollout import encode_prompts, tool_record
from grpo_jax.runner.guards import CollapseWatch, SkipCounter
from grpo_jax.runner.rewards import resolve_reward_fns
from grpo_jax.runner.rollouts import launch_collect
from grpo_jax.runner.toolkit import (SAMPLE_EVERY, StepTimer, device_batch, log_samples,
                                     log_step, progress, prompt_text)
from grpo_jax.sampling import check_prompt_groups
from grpo_jax.tasks.base import Example
from grpo_jax.tasks.data import prompt_iterator

# Every RL stage's metrics line has these (besides reward/<name> per reward component).
CORE_METRICS = ("stage_step", "reward_mean", "reward_std", "pass@1", "completion_length",
                "truncated_frac", "loss", "entropy", "grad_norm", "learning_rate",
                "logp_diff_max", "logp_diff_mean", "skipped_steps", "sample_time_s",
                "update_time_s", "step_time_s", "compile_time_s")


class Learner:
    """What an RL stage kind plugs into `rl_loop`.

    Attributes:
      state: the checkpointed pytree; `state["params"]` is the policy's parameters.
    """

    state: dict

    def iterate(self, batch: RolloutBatch, rollout, step: int) -> dict:
        """One iteration on a rollout batch: updates `self.state`, returns float metrics.

        `batch` is the rollout's `RolloutBatch` on the data mesh (no advantages yet);
        `rollout` the host-side rollout (components, lengths, truncated, prompts). The
        metrics must include loss, entropy, grad_norm, learning_rate, logp_diff_max and
        logp_diff_mean, and "skipped" > 0 when an update was not applied because a value was
        not finite.
        """
        raise NotImplementedError

    def host_state(self) -> dict:
        """JSON-able state saved in checkpoint meta (restored by `load_host_state`)."""
        return {}

    def load_host_state(self, meta: dict) -> None:
        del meta


def minibatches(batch, *, num_iterations: int, num_minibatches: int,
                seed: tuple[int, ...]) -> Iterator:
    """mu passes over the batch, each in `num_minibatches` random row subsets.

    Rows of a subset keep their batch order (sorted indices); one minibatch is the batch.
    The permutation of pass `it` is drawn from `np.random.default_rng([*seed, it])`.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]
    per = rows // num_minibatches
    for it in range(num_iterations):
        order = np.random.default_rng([*seed, it]).permutation(rows)
        for mb in range(num_minibatches):
            if num_minibatches == 1:
                yield batch
            else:
                idx = np.sort(order[mb * per:(mb + 1) * per])
                yield jax.tree.map(lambda x, idx=idx: x[idx], batch)


def reduce_update_metrics(metrics: list[dict]) -> dict:
    """Metrics of several updates as host floats: the maximum of `*_max`, else the mean."""
    def reduce(key):
        values = jnp.stack([m[key] for m in metrics])
        return jnp.max(values) if key.endswith("_max") else jnp.mean(values)

    return {k: float(v) for k, v in jax.device_get({k: reduce(k) for k in metrics[0]}).items()}


class StalenessError(RuntimeError):
    """A rollout batch from parameters the schedule does not allow (a bookkeeping bug)."""


def check_versions(version, step: int, max_staleness: int) -> np.ndarray:
    """The staleness step - version [B] of a batch that update `step` trains on, after
    checking that every row comes from a version the trainer produced (0 <= version <=
    step) no older than `max_staleness` updates; raises StalenessError otherwise."""
    version = np.asarray(version)
    staleness = step - version
    bad = np.flatnonzero((version < 0) | (staleness < 0) | (staleness > max_staleness))
    if len(bad):
        raise StalenessError(
            f"update {step} was given row {bad[0]} sampled by parameter version "
            f"{int(version[bad[0]])}: the schedule allows versions {max(step - max_staleness, 0)}"
            f"..{step} (rl.max_staleness {max_staleness}); nothing was trained on it")
    return staleness


_ROLLOUT_ARRAYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "sample_logp", "lengths",
                   "rewards", "truncated", "loss_mask")
_EPISODE_ARRAYS = ("turns", "tool_errors")  # multi-turn rollouts only


def _arrays_of(ro) -> tuple[str, ...]:
    return _ROLLOUT_ARRAYS + (_EPISODE_ARRAYS if ro.turns is not None else ())


class PendingRollouts:
    """The rollouts sampled ahead of their update (rl.max_staleness K > 0), in order: entry
    i is (the update it is for, its rollout, examples, info, the parameter version that
    sampled it). Checkpointed with the stage: the arrays in the checkpoint's state, the rest
    in its meta; the texts are decoded again from the tokens."""

    def __init__(self):
        self.entries = []

    def __len__(self):
        return len(self.entries)

    def tree(self) -> dict:
        """The arrays, a pytree for the checkpoint."""
        return {str(i): {**{k: getattr(ro, k) for k in _arrays_of(ro)},
                         "components": dict(ro.components),
                         "version": np.asarray(version, np.int32)}
                for i, (_, ro, _, _, version) in enumerate(self.entries)}

    def meta(self) -> list:
        return [{"step": step, "examples": [ex.to_dict() for ex in examples], "info": info,
                 "components": list(ro.components), "episodes": ro.turns is not None}
                for step, ro, examples, info, _ in self.entries]

    @staticmethod
    def template(meta: list, *, rows: int, prompt_len: int, new_tokens: int) -> dict:
        """The shapes of the arrays of the entries `meta` describes (a restore target)."""
        def entry(components, episodes):
            arrays = {"prompt_tokens": np.zeros((rows, prompt_len), np.int32),
                      "prompt_mask": np.zeros((rows, prompt_len), bool),
                      "tokens": np.zeros((rows, new_tokens), np.int32),
                      "mask": np.zeros((rows, new_tokens), bool),
                      "loss_mask": np.zeros((rows, new_tokens), bool),
                      "sample_logp": np.zeros((rows, new_tokens), np.float32),
                      "lengths": np.zeros((rows,), np.int32),
                      "rewards": np.zeros((rows,), np.float32),
                      "truncated": np.zeros((rows,), bool),
                      "components": {name: np.zeros((rows,), np.float32)
                                     for name in components},
                      "version": np.zeros((), np.int32)}
            if episodes:
                arrays.update({name: np.zeros((rows,), np.int32) for name in _EPISODE_ARRAYS})
            return arrays

        return {str(i): entry(record["components"], record.get("episodes", False))
                for i, record in enumerate(meta)}

    @classmethod
    def restore(cls, tree: dict, meta: list, tokenizer, example_type) -> PendingRollouts:
        from grpo_jax.rl.rollout import Rollout

        pending = cls()
        for i, record in enumerate(meta):
            arrays = {k: np.asarray(v) for k, v in tree[str(i)].items() if k != "components"}
            tokens, mask = arrays["tokens"], arrays["mask"]
            texts = [tokenizer.decode(tokens[r][mask[r]].tolist()) for r in range(len(tokens))]
            components = {k: np.asarray(v) for k, v in tree[str(i)]["components"].items()}
            version = int(arrays.pop("version"))
            ro = Rollout(texts=texts, components=components, **arrays)
            examples = [example_type.from_dict(e) for e in record["examples"]]
            pending.entries.append((record["step"], ro, examples, record["info"], version))
        return pending


def start_stage(run, stage, learner: Learner, pending_target: dict | None = None):
    """The stage's prompt iterator and first step, with the learner's state, the iterator's
    position and the host state restored when the stage resumes; run.params is the policy.
    With `pending_target` (the arrays of the rollouts sampled ahead, `PendingRollouts`)
    returns a third item, their restored arrays (None when the stage starts afresh).

    Every process iterates the same global prompt stream (no per-host shard): the batch
    does not depend on the number of processes; each samples and scores its block of rows.
    """
    cfg = run.config
    iterator = prompt_iterator(run.task.examples("train", cfg.task.train_size, seed=cfg.seed),
                               batch_size=stage.section.num_prompts,
                               seed=run.stage_seed(stage.index, "prompts"),
                               shard_index=0, shard_count=1)
    start, pending = 0, None
    if stage.resume_meta is not None:
        target = learner.state if not pending_target else {**learner.state,
                                                           "pending": pending_target}
        state = run.restore_stage(target)
        pending = state.pop("pending", None)
        learner.state = state
        iterator.set_state(stage.resume_meta["data_state"])
        learner.load_host_state(stage.resume_meta)
        start = int(stage.resume_meta["stage_step"])
    run.params = learner.state["params"]
    if pending_target is not None:
        return iterator, start, pending
    return iterator, start


def rl_loop(run, stage, learner: Learner, *, sampling, dynamic: bool = False) -> None:
    """Runs `stage.section.steps` RL iterations of `learner` and ends the stage.

    The section needs steps, num_prompts, group_size, rewards and checkpoint_every (and
    max_sampling_rounds with `dynamic`); its overlong_cache, when it has one, turns on the
    soft overlong punishment.
    """
    section, cfg = stage.section, run.config
    overlong_cache = section.get("overlong_cache", 0)
    staleness = section.get("max_staleness", 0)
    g = section.group_size
    weights = dict(section.rewards.to_dict())
    reward_fns = resolve_reward_fns(run, weights, section=section)
    template = None
    saved = (stage.resume_meta or {}).get("pending", [])
    if saved:  # a checkpoint with rollouts sampled ahead
        template = PendingRollouts.template(saved, rows=section.num_prompts * g,
                                            prompt_len=cfg.task.prompt_len,
                                            new_tokens=section.max_new_tokens)
    iterator, start, *restored = start_stage(run, stage, learner, template)
    pending = PendingRollouts()
    if restored and restored[0] is not None:
        pending = PendingRollouts.restore(restored[0], stage.resume_meta["pending"],
                                          run.tokenizer, Example)
    skips = SkipCounter(cfg.max_consecutive_skips)
    collapse = CollapseWatch()
    bar = progress(stage, section.steps, start)
    ahead = start + len(pending)  # the next update to sample for
    for step in range(start, section.steps):
        timer = StepTimer()
        undecided = undecided_comparisons()
        # Sample for updates step .. step + K with the current parameters (version step):
        # the rollouts of update t come from version max(t - K, 0). On rollout devices of
        # their own (mesh.rollout_devices) the ones for later updates finish after this
        # update, which runs beside them.
        launched = []
        while ahead <= min(step + staleness, section.steps - 1):
            launched.append((ahead, launch_collect(
                run, stage, iterator, ahead, sampling=sampling, weights=weights,
                reward_fns=reward_fns, dynamic=dynamic, overlong_cache=overlong_cache)))
            ahead += 1
        later = run.rollout_mesh is not None
        for for_step, finish in launched:
            if not later or for_step == step:
                pending.entries.append((for_step, *finish(), step))
        launched = [(s, f) for s, f in launched if later and s != step]
        for_step, ro, examples, info, version = pending.entries.pop(0)
        if for_step != step:
            raise StalenessError(f"update {step} was given the rollout sampled for update "
                                 f"{for_step}")
        stale = check_versions(np.full(len(ro.rewards), version), step, staleness)
        batch = device_batch(run, rollout_batch(ro.prompt_tokens, ro.prompt_mask, ro.tokens,
                                                ro.mask, ro.sample_logp, ro.rewards,
                                                version=version, loss_mask=ro.loss_mask))
        if staleness:
            info = {**info, "staleness": float(np.mean(stale))}
        timer.lap("sample")
        metrics = learner.iterate(batch, ro, step)
        run.params = learner.state["params"]
        for for_step, finish in launched:  # sampled with the parameters before the update
            pending.entries.append((for_step, *finish(), step))
        timer.lap("update")
        correct = ro.components.get("accuracy", ro.rewards) >= 1.0
        rollout_metrics = rollout_record(ro.rewards, ro.components, correct, ro.lengths,
                                         ro.truncated, group_size=g)
        record = {
            "stage_step": step + 1,
            **{k: float(v) for k, v in jax.device_get(rollout_metrics).items()},
            **info,
            **(tool_record(ro) if ro.turns is not None else {}),
            "reward_undecided": float(undecided_comparisons() - undecided),
            **metrics,
            **timer.record(),
        }
        record.update(skips.count(metrics))
        log_step(run, stage, record, bar, reward="reward_mean", acc="pass@1")
        if step == 0 or (step + 1) % SAMPLE_EVERY == 0:
            log_samples(run, stage, examples, ro.texts, ro.rewards, ro.components)
        skips.check(stage.name, step + 1)
        collapse.check(stage.name, step + 1, record)
        state, extra = learner.state, {}
        if len(pending):  # the rollouts sampled ahead are part of the stage's state
            state, extra = {**state, "pending": pending.tree()}, {"pending": pending.meta()}
        run.save_if_due(stage, state, stage_step=step + 1, total=section.steps,
                        every=section.checkpoint_every, data_state=iterator.get_state(),
                        **extra, **learner.host_state())
    bar.close()
    run.finish_stage(stage, section.steps)


def fused_rl_loop(run, stage, learner: Learner, *, program, chunk: int, answers_fn,
                  schedule) -> None:
    """`rl_loop` with every iteration on device: `chunk` iterations per call of `program`
    (`grpo_jax.rl.fused.make_fused_iterations`), one host round trip per chunk.

    The prompts, their order and the sampling keys are those of the host loop; the
    checkpoints fall at chunk ends (validation makes steps and checkpoint_every multiples
    of `chunk`). `answers_fn(examples) -> [B] int32` gives the device rewards' references.
    The whole iteration is one program, so a row logs step_time_s (the chunk's time over
    its iterations) and compile_time_s, not a sample/update split.
    """
    section, cfg = stage.section, run.config
    g = section.group_size
    iterator, start = start_stage(run, stage, learner)
    skips = SkipCounter(cfg.max_consecutive_skips)
    collapse = CollapseWatch()
    bar = progress(stage, section.steps, start)
    spec = run.data_sharding.spec
    rows = jax.sharding.NamedSharding(run.mesh, jax.sharding.PartitionSpec(None, *spec))
    for first in range(start, section.steps, chunk):
        timer = StepTimer()
        tokens, masks, answers = [], [], []
        for _ in range(chunk):
            examples = [ex for ex in next(iterator) for _ in range(g)]
            prompt, mask = encode_prompts(run.tokenizer, [prompt_text(run, ex) for ex in examples],
                                          prompt_len=cfg.task.prompt_len,
                                          ids=[ex.id for ex in examples])
            check_prompt_groups(prompt, mask, g)  # the program runs each prompt once
            tokens.append(prompt), masks.append(mask), answers.append(answers_fn(examples))
        keys = jnp.stack([jax.random.fold_in(run.stage_key(stage.index, step), 0)
                          for step in range(first, first + chunk)])
        inputs = jax.device_put((np.stack(tokens), np.stack(masks), np.stack(answers)), rows)
        versions = jnp.arange(first, first + chunk, dtype=jnp.int32)
        learner.state, metrics = program(learner.state, *inputs, keys, versions)
        run.params = learner.state["params"]
        metrics = jax.device_get(metrics)
        times = timer.record()
        for i, step in enumerate(range(first, first + chunk)):
            record = {
                "stage_step": step + 1,
                **{k: float(v[i]) for k, v in metrics.items()},
                "sampling_rounds": 1,
                "learning_rate": float(schedule(step)),
                "step_time_s": times["step_time_s"] / chunk,
                "compile_time_s": times["compile_time_s"] if i == 0 else 0.0,
            }
            record.update(skips.count(record))
            log_step(run, stage, record, bar, reward="reward_mean", acc="pass@1")
            skips.check(stage.name, step + 1)
            collapse.check(stage.name, step + 1, record)
        run.save_if_due(stage, learner.state, stage_step=first + chunk, total=section.steps,
                        every=section.checkpoint_every, data_state=iterator.get_state())
    bar.close()
    run.finish_stage(stage, section.steps)
