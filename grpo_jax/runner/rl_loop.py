"""The one RL loop every RL stage kind (the GRPO family, PPO, TRPO) runs.

    rollout source (host: sample, decode, score, one step at a time;
                    device: K whole iterations in one program)
        -> the kind's `Learner.iteration(state, batch) -> (state, metrics)`
        -> the shared record -> log -> checkpoint when due

A kind supplies a `Learner`: its checkpointed state (a pytree whose "params" is the
policy), its pure `iteration` (the same function whichever source feeds it: the host source
runs it jitted on each rollout batch, the device source traces it inside its program), and
optional host-side state kept in checkpoint meta (e.g. PPO's adaptive KL coefficient). The
stage's loop settings are one frozen `LoopSettings`, built once from the section's field
groups. Everything else (the prompt iterator and its resume, the core metrics, skips,
checkpoints) is here, once; the sources are in `runner.sources`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rl.batch import RolloutBatch
from grpo_jax.runner.guards import CollapseWatch, SkipCounter
from grpo_jax.runner.inputs import train_examples
from grpo_jax.runner.toolkit import (SAMPLE_EVERY, SAMPLES_PER_LOG, log_samples, log_step,
                                     progress, sampling_config)
from grpo_jax.sampling import SamplingConfig
from grpo_jax.tasks.data import prompt_iterator
from grpo_jax.training import jit_update

# Every RL stage's metrics line has these (besides reward/<name> per reward component).
CORE_METRICS = ("stage_step", "reward_mean", "reward_std", "pass@1", "completion_length",
                "completion_tokens", "truncated_frac", "loss", "entropy", "grad_norm",
                "learning_rate", "logp_diff_max", "logp_diff_mean", "skipped_steps",
                "sample_time_s", "update_time_s", "step_time_s", "compile_time_s")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """The RL loop's settings of one stage, built once (`of`) from its section's field
    groups (`runner.fields`: loop, sampling, off-policy, tools) and the kind's own values.

    A field whose group the section lacks keeps its default here (e.g. TRPO has no
    off-policy group: max_staleness 0).
    """

    steps: int
    num_prompts: int
    group_size: int
    rewards: tuple[tuple[str, float], ...]  # (name, weight) in the section's order
    checkpoint_every: int
    max_new_tokens: int
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    overlong_cache: int = 0
    max_staleness: int = 0
    partial_tokens: int = 0  # > 0: partial rollouts (`runner.partial`)
    tools: str = ""
    max_turns: int = 0
    max_observation_tokens: int = 0
    max_wait_tokens: int = 0
    dynamic_sampling: bool = False  # DAPO's: resample groups without signal (rl kind)
    max_sampling_rounds: int = 1
    fused_steps: int = 0  # > 0: the device source, this many iterations per program
    pack_blocks: int = 0  # > 0: the host source packs each batch's rows (`rl.packing`)
    slots: int = 0  # > 0: continuous batching in the sampler (`DecodeSpec.continuous`)

    @classmethod
    def of(cls, section, groups, **kind) -> LoopSettings:
        """The settings of `section`, which has the field `groups`; `kind` gives the values
        the kind's own fields resolve to (temperature, dynamic_sampling, ...)."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {}
        for group in groups:
            values.update({k: v for k, v in group.values(section).items() if k in names})
        values["rewards"] = tuple((k, float(v)) for k, v in dict(section.rewards).items())
        return cls(**{**values, **kind})

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.rewards)

    def sampling(self, run) -> SamplingConfig:
        """The sampler's settings; a rollout holds group_size completions of each prompt,
        so the prefill runs once per group."""
        config = sampling_config(run, max_new_tokens=self.max_new_tokens,
                                 temperature=self.temperature, top_k=self.top_k,
                                 top_p=self.top_p)
        return dataclasses.replace(config, prompt_group=self.group_size, slots=self.slots)


class Learner:
    """What an RL stage kind plugs into `rl_loop`.

    Attributes:
      state: the checkpointed pytree; `state["params"]` is the policy's parameters and
        `state["version"]` (set by the loop) the number of iterations the stage has run:
        the version of the parameters, in the vocabulary of `batch.version`.
      logs_staleness: whether `step` logs the rows' staleness (a stage that samples ahead).
    """

    state: dict
    logs_staleness = False
    _jitted = None

    def iteration(self, state: dict, batch: RolloutBatch) -> tuple[dict, dict]:
        """One iteration, pure: (state, batch) -> (state, scalar metrics).

        `batch` is a rollout's `RolloutBatch` (no advantages yet; `correct` and `truncated`
        set). The metrics must include loss, entropy, grad_norm, logp_diff_max and
        logp_diff_mean, and "skipped" > 0 when an update was not applied because a value
        was not finite. The returned state has the structure of `state`.
        """
        raise NotImplementedError

    def step(self, state: dict, batch: RolloutBatch) -> tuple[dict, dict]:
        """`iteration` with the versions: the rows' staleness is the learner's version minus
        the version that sampled them (`batch.version`), logged as "staleness" (the mean
        over rows, or over the trained tokens when the versions are per token) when
        `logs_staleness`; the version counts the iteration. Pure: the host source jits
        it, the device source scans it."""
        version = state["version"]
        staleness = (version - batch.version).astype(jnp.float32)
        if staleness.ndim == 2:
            mask = batch.loss_mask.astype(jnp.float32)
            staleness = jnp.sum(staleness * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        state, metrics = self.iteration(state, batch)
        if self.logs_staleness:
            metrics = {**metrics, "staleness": jnp.mean(staleness)}
        return {**state, "version": version + 1}, metrics

    def host_batch(self, batch: RolloutBatch, step: int) -> RolloutBatch:
        """The batch of update `step` as the host source hands it to `iteration`: host-side
        work before it (e.g. a reference reset, the minibatch order). Default: as is."""
        del step
        return batch

    def iterate(self, batch: RolloutBatch, step: int) -> dict:
        """One iteration on the host: the jitted `step` (state donated) on
        `host_batch(batch, step)`; float metrics."""
        if self._jitted is None:
            self._jitted = jit_update(self.step, num_state_args=1)
        batch = self.host_batch(batch, step)  # first: it may change the state (a reference
        # reset), which the step must then receive
        self.state, metrics = self._jitted(_on_mesh(self.state), batch)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def learning_rate(self, step: int) -> float | None:
        """The learning rate of update `step` (logged), or None when the metrics have it."""
        del step
        return None

    def host_state(self) -> dict:
        """JSON-able state saved in checkpoint meta (restored by `load_host_state`)."""
        return {}

    def load_host_state(self, meta: dict) -> None:
        del meta


def _on_mesh(state: dict) -> dict:
    """`state` with the leaves not yet placed on the mesh of its placed ones (e.g. a new
    head's parameters, a host value) replicated there: the jitted iteration pins the
    state's shardings at its first call, and a leaf placed otherwise at a later call would
    compile it again."""
    meshes = [x.sharding.mesh for x in jax.tree.leaves(state)
              if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)]
    if not meshes:
        return state
    replicated = jax.sharding.NamedSharding(meshes[0], jax.sharding.PartitionSpec())
    return jax.tree.map(
        lambda x: x if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
        else jax.device_put(x, replicated), state)


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


def stage_prompts(run, stage):
    """The prompt batches of an RL stage from its start: the training problems
    (`inputs.train_examples`) in an order drawn from (seed, the stage's name), so two pipelines running a stage of one
    name at different positions see the same prompts, batch by batch."""
    return prompt_iterator(train_examples(run.config, run.task),
                           batch_size=stage.section.num_prompts,
                           seed=run.stage_seed(stage.name, "prompts"),
                           shard_index=0, shard_count=1)


def start_stage(run, stage, learner: Learner, extra_target: dict | None = None):
    """(the stage's prompt iterator, its first step, the restored `extra_target` items),
    with the learner's state, the iterator's position and the host state restored when the
    stage resumes; run.params is the policy. `extra_target`: more checkpointed items (a
    source's pending rollouts) restored beside the learner's state; {} on a fresh start.

    Every process iterates the same global prompt stream (no per-host shard): the batch
    does not depend on the number of processes; each samples and scores its block of rows.
    """
    iterator = stage_prompts(run, stage)
    learner.state = _on_mesh({**learner.state, "version": jnp.zeros((), jnp.int32)})
    start, extra = 0, {}
    if stage.resume_meta is not None:
        state = run.restore_stage({**learner.state, **(extra_target or {})})
        extra = {k: state.pop(k) for k in (extra_target or {})}
        learner.state = state
        iterator.set_state(stage.resume_meta["data_state"])
        learner.load_host_state(stage.resume_meta)
        start = int(stage.resume_meta["stage_step"])
    run.params = learner.state["params"]
    return iterator, start, extra


def rl_loop(run, stage, learner: Learner, source) -> None:
    """Runs the stage's RL iterations of `learner` on the rollouts of `source`
    (`runner.sources`: HostSource or DeviceSource) and ends the stage.

    Each call of `source.steps` runs one or more iterations and returns their metrics
    lines; the loop adds the shared fields, logs them, checks skips and collapse, and
    checkpoints (with the source's own state: its pending rollouts) when due.
    """
    settings = source.settings
    iterator, step, restored = start_stage(run, stage, learner,
                                           source.restore_target(stage.resume_meta))
    source.restore(restored, stage.resume_meta)
    skips = SkipCounter(run.config.max_consecutive_skips)
    collapse = CollapseWatch()
    bar = progress(stage, settings.steps, step)
    while step < settings.steps:
        for line in source.steps(step, iterator, learner):
            samples = line.pop("samples", None)
            lr = learner.learning_rate(step)
            record = {"stage_step": step + 1, **line,
                      **({"learning_rate": lr} if lr is not None else {})}
            record.update(skips.count(record))
            log_step(run, stage, record, bar, reward="reward_mean", acc="pass@1")
            # config.rl_samples_logged (optional): -1 logs every completion of every step
            # with its reward components (host rollouts), e.g. for a study that scores each
            # training problem over the run; else the first that many every SAMPLE_EVERY
            logged = run.config.get("rl_samples_logged", SAMPLES_PER_LOG)
            every = logged == -1
            if samples is not None and (every or step == 0 or (step + 1) % SAMPLE_EVERY == 0):
                log_samples(run, stage, *samples, limit=len(samples[1]) if every else logged)
            skips.check(stage.name, step + 1)
            collapse.check(stage.name, step + 1, record)
            step += 1
        run.params = learner.state["params"]
        state, meta = source.checkpoint(learner.state)
        run.save_if_due(stage, state, stage_step=step, total=settings.steps,
                        every=settings.checkpoint_every, data_state=iterator.get_state(),
                        **meta, **learner.host_state())
    bar.close()
    run.finish_stage(stage, settings.steps)
