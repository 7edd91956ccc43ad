"""The `Run`: everything the stages of one run share.

config, task, tokenizer, mesh, the policy (graph) and its parameters, the metric writer, the
checkpointer, the PRNG key and the global step. The task, tokenizer and prompt bucket come
built from validation (`inputs.RunInputs`); the Run trains only a tokenizer that lives in its
workdir. Checkpoints carry the stage index and step, so `resume_point` (runner.resume)
tells the pipeline which stage to start and whether it resumes mid-way.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import time
import zlib
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from grpo_jax import compilation, parallel, storage
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import MetricWriter
from grpo_jax.trackers import TrackerError, parse_loggers
from grpo_jax.models import Transformer, lora
from grpo_jax.runner import resume
from grpo_jax.runner.inputs import RunInputs, with_tokenizer
from grpo_jax.runner.model_init import build_model, lora_summary, model_config_for, with_lora
from grpo_jax.runner.run_directory import CONFIG_FILE, HISTORY_FIELD
from grpo_jax.runner.tokenizers import build_tokenizer
from grpo_jax.runner.checks import (ConfigError, check_vocabulary, extendable_stage, mesh_rules,
                                    stage_names)
from grpo_jax.runner.guards import NonFiniteError, Preempted, StopRequest, WorkdirLock
from grpo_jax.runner.report import code_provenance
from grpo_jax.runner.resume import CorruptCheckpointError, check_config_drift
from grpo_jax.runner.validation import check_stages, validate
from grpo_jax.training import Policy, all_finite, default_batch_streams

__all__ = ["CorruptCheckpointError", "Run", "StageSpec", "derive_seed", "mesh_devices"]

_all_finite = jax.jit(all_finite)  # one program per parameter structure


@dataclasses.dataclass
class StageSpec:
    """One entry of config.stages."""

    index: int  # position in config.stages
    name: str  # config section name
    section: ml_collections.ConfigDict
    resume_meta: dict | None  # meta of an unfinished checkpoint of this stage, if resuming


def derive_seed(seed: int, stage: str, purpose: str) -> int:
    """The seed of one random draw of a stage: numpy's SeedSequence of (seed, CRC-32 of the
    stage's name, CRC-32 of `purpose`), as a non-negative int below 2**31 (every seed argument
    takes it: numpy, grain, nnx.Rngs, task.examples). Distinct stages and purposes get
    unrelated streams, and the same triple always the same seed. A stage's draws depend on
    what it is (its config section's name), not on where it sits in config.stages, so two
    pipelines that run an `rl` stage at different positions draw its prompts and keys alike
    for one seed (the pairing a study's arms need)."""
    entropy = [int(seed), _name_code(stage), _name_code(purpose)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)


def _name_code(name: str) -> int:
    if not isinstance(name, str):
        raise TypeError(f"derive_seed: a stage is named by a string, got {name!r}")
    return zlib.crc32(name.encode("utf-8"))


class Run:
    """Everything stages share.

    Args:
      config: the run config.
      workdir: the run directory (created): a path, made absolute, or a URL such as
        gs://bucket/run, which stays one (`grpo_jax.storage`: every file of the run goes
        through etils.epath there).
      kinds: the stage-kind registry.
      inputs: what `validation.validate(config, kinds)` built (task, tokenizer, prompt
        bucket); None validates here. A tokenizer trained in the workdir (absent from
        `inputs`) is trained or loaded here and the stages checked again with its bucket;
        `run.inputs` then holds it, for a Run rebuilt in the same workdir.
      stop: the SIGTERM / SIGINT flag of a run in progress.
    """

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, kinds,
                 inputs: RunInputs | None = None, *, stop: StopRequest | None = None):
        self.config, self.kinds = config, kinds
        self.stop = stop  # set while a run is in progress: SIGTERM / SIGINT requests
        self.inputs = validate(config, kinds) if inputs is None else inputs
        self.workdir = storage.normalize(workdir)
        local = storage.local_path(self.workdir)
        created = local is not None and not os.path.exists(local)
        storage.makedirs(self.workdir)
        self.lock = WorkdirLock(self.workdir)
        if jax.process_index() == 0:  # one run per workdir (process 0 holds the lock)
            self.lock.acquire()
        try:
            self._setup(config)
        except ConfigError:
            self.lock.release()
            if created and jax.process_index() == 0:  # a bad config leaves nothing behind
                shutil.rmtree(local, ignore_errors=True)
            raise
        except BaseException:
            self.lock.release()
            raise

    def _setup(self, config) -> None:
        self.stage_names = stage_names(config)
        self.history = check_config_drift(config, self.workdir)
        inputs = self.inputs
        primary = parallel.is_primary()  # process 0 writes the run's files
        tokenizer = inputs.tokenizer
        if tokenizer is None and primary:  # trained in the workdir once, by process 0
            tokenizer = build_tokenizer(config, inputs.task, self.workdir)
        # Every process has read config.json (above) before process 0 rewrites it, and finds
        # the tokenizer process 0 saved.
        parallel.sync("grpo_jax: config.json read, tokenizer saved")
        if tokenizer is None:
            tokenizer = build_tokenizer(config, inputs.task, self.workdir)
        if inputs.tokenizer is None:  # its prompt bucket, and the stages checked with it
            self.inputs = inputs = with_tokenizer(config, inputs, tokenizer)
            check_stages(config, self.kinds, inputs)
        self.task, self.tokenizer = inputs.task, inputs.tokenizer
        record = json.loads(config.to_json_best_effort())  # as given (prompt_len 0 = auto)
        # The run's config has the measured prompt bucket.
        self.config = config = copy.deepcopy(config)
        config.task.prompt_len = inputs.prompt_len
        self.mesh = parallel.make_mesh(config.mesh.shape.to_dict(),
                                       devices=mesh_devices(config))
        self.rules = mesh_rules(config)
        self.data_sharding = parallel.data_sharding(self.mesh)
        split = rollout_devices(config)
        self.rollout_mesh = parallel.make_mesh({"data": -1}, devices=split) if split else None
        # On it: (the run's policy, its copy there, parameter shardings, params, their source)
        self._rollout = None
        self.model_config, model = build_model(config, self.tokenizer)
        check_vocabulary(self.tokenizer, self.model_config.vocab_size,
                         config.model.init_from or config.model.name)
        self.policy, self.params = with_lora(config, *self.place_model(model), self.mesh,
                                             seed=derive_seed(config.seed, "model", "lora"))
        # "lora: rank r ... N trainable parameters": said at start-up and in the report
        self.lora_line = lora_summary(config, self.model_config)
        if self.lora_line and primary:
            print(f"[grpo_jax] {self.lora_line}", flush=True)
        del model
        # Replicated on the mesh: a multi-controller checkpoint holds only global arrays.
        self.key = jax.jit(lambda: jax.random.key(config.seed),
                           out_shardings=parallel.replicated_sharding(self.mesh))()
        try:
            self.writer = MetricWriter(self.workdir, active=primary,
                                       loggers=parse_loggers(config.get("loggers",
                                                                        "tensorboard")))
        except TrackerError as err:  # e.g. mlflow with a gs:// workdir: one line, exit 2
            raise ConfigError(str(err)) from None
        self.checkpointer = Checkpointer(
            storage.join(self.workdir, "checkpoints"), max_to_keep=keep_count(config))
        self.global_step = 0  # checkpoint numbering: +1 per training step and per stage end
        self.evals: dict[str, dict] = {}  # finished eval stages' figures (kept in meta)
        self.extra_meta: dict[str, Any] = {}
        # stage name -> {wall_s, compile_s, steps} of each finished stage (kept in meta)
        self.stage_times: dict[str, dict] = {}
        self._stage_clock = (time.time(), compilation.CLOCK.seconds(), 0.0, 0.0)
        if self.history:
            record[HISTORY_FIELD] = self.history
        self.record = record  # config.json's content, kept in every checkpoint's meta too
        # The code at the start (git commit, versions), for report.json; process 0 writes it.
        self.provenance = code_provenance() if primary else None
        if primary:
            storage.write_text(storage.join(self.workdir, CONFIG_FILE),
                               json.dumps(record, indent=2))

    # ------------------------------------------------------------------ the model
    def place_model(self, model) -> tuple[Policy, Any]:
        """(Policy, params) of an NNX model with its parameters sharded on the run's mesh."""
        model = parallel.shard_model_state(model, self.mesh, self.rules)
        streams = self.config.model.batch_streams or default_batch_streams()
        return Policy.from_model(model, logprob_chunk_size=self.config.model.logprob_chunk_size,
                                 batch_streams=streams,
                                 logprob_chunk_rows=self.config.model.logprob_chunk_rows)

    def sampler(self) -> tuple[Policy, Any]:
        """(Policy, params) the RL rollouts are sampled with: the run's own, or with
        mesh.rollout_devices a copy on the rollout mesh (rows over its devices, the weights
        whole on each), moved there by `jax.device_put` when run.params changed (a LoRA tree
        merged first). The sampler is then a separate set of devices the trainer never
        waits on for anything but these parameters."""
        if self.rollout_mesh is None:
            return self.policy, self.params
        if self._rollout is None or self._rollout[0] is not self.policy:
            model = nnx.merge(self.policy.graphdef, self.policy.template)
            model = parallel.shard_model_state(model, self.rollout_mesh, self.rules)
            policy, params = Policy.from_model(
                model, logprob_chunk_size=self.config.model.logprob_chunk_size)
            shardings = jax.tree.map(lambda x: x.sharding, params)
            self._rollout = (self.policy, policy, shardings, None, None)
        owner, policy, shardings, params, source = self._rollout
        if source is not self.params:
            params = jax.device_put(nnx.to_pure_dict(self.policy.state(self.params)), shardings)
            self._rollout = (owner, policy, shardings, params, self.params)
        return policy, params

    def replace_model(self, model_name: str, *, seed: int) -> None:
        """Makes a fresh model of another named size the run's model (distillation).

        Every later stage trains and samples it, and every later checkpoint records
        `model_name` in its meta so that a resume rebuilds the same shape (`resume_point`).
        """
        self.model_config = model_config_for(self.config, self.tokenizer.vocab_size,
                                             model_name)
        self.policy, self.params = self.place_model(
            Transformer(self.model_config, rngs=nnx.Rngs(seed)))
        self.extra_meta["model_name"] = model_name

    # ------------------------------------------------------------------ keys and seeds
    def stage_key(self, stage: str, step: int) -> jax.Array:
        """The key of step `step` of the stage named `stage`: a pure function of the seed
        and the stage's name (not its position: `derive_seed`), so resumes are exact."""
        return jax.random.fold_in(jax.random.fold_in(self.key, _name_code(stage) >> 1), step)

    def stage_seed(self, stage: str, purpose: str) -> int:
        """The host seed of one draw of the stage named `stage` ("problems", "batches",
        "init", ...): `derive_seed(config.seed, stage, purpose)`, the one way every stage
        seeds numpy, task draws and initialisations, so a resumed stage draws the same and
        no two draws share a stream."""
        return derive_seed(self.config.seed, stage, purpose)

    # ------------------------------------------------------------------ checkpoints
    def meta(self, stage: StageSpec, *, stage_step: int, done: bool, **extra) -> dict:
        return {
            "stage_index": stage.index,
            "stage": stage.name,
            "stage_step": stage_step,
            "stage_done": done,
            "global_step": self.global_step,
            "evals": self.evals,
            "stage_times": self.stage_times,
            "stage_clock": self.stage_clock(),
            resume.RUN_CONFIG_FIELD: self.record,
            **self.extra_meta,
            **extra,
        }

    def save(self, stage: StageSpec, state: dict, *, stage_step: int, done: bool,
             force: bool = True, **extra) -> bool:
        """Checkpoint `state` plus the run's PRNG key under the current global step (False
        when that step is already saved). Parameters that are not finite are never written.
        The metric log is flushed first, so that on an object store (where it is written now
        and then) it reaches every checkpoint. A LoRA tree's frozen base is not written (the
        run rebuilds it from its config): only its adapters."""
        if not bool(_all_finite(state["params"])):
            raise NonFiniteError(f"{stage.name} step {stage_step}: the parameters are not "
                                 "finite; not writing them to a checkpoint")
        self.writer.flush()
        return self.checkpointer.save(
            self.global_step, state={**lora.detach_bases(state)[0], "rng": self.key},
            meta=self.meta(stage, stage_step=stage_step, done=done, **extra), force=force
        )

    def save_if_due(self, stage: StageSpec, state: dict, *, stage_step: int, total: int,
                    every: int, **extra) -> None:
        """A mid-stage checkpoint every `every` steps, and a full-state one after the last
        step of the run's extendable stage (`checks.extendable_stage`: the last that is not
        an eval; raising its steps later continues from it).

        Then, if a stop was requested (SIGTERM / SIGINT), a checkpoint of this step and
        `Preempted`; at a stage's last step the stage finishes first (the pipeline stops
        between stages)."""
        self.checkpointer.check_errors()  # an asynchronous save failed: stop now
        last = stage.index == extendable_stage(self.config)
        if (every and stage_step % every == 0 and stage_step < total) or \
                (last and stage_step == total):
            self.save(stage, state, stage_step=stage_step, done=False, **extra)
        if self.stop is not None and self.stop.agreed() and stage_step < total:
            self.save(stage, state, stage_step=stage_step, done=False, **extra)
            self.checkpointer.wait()
            raise Preempted(self.stopped_line(f"{stage.name} step {stage_step}"))

    def stopped_line(self, where: str) -> str:
        return (f"[grpo_jax] stopped on {self.stop.requested} after {where}: checkpoint "
                f"{storage.join(self.checkpointer.directory, str(self.global_step))}; run the "
                "same command to resume")

    def begin_stage(self, stage: StageSpec) -> None:
        """Starts the stage's clock; a resumed stage continues from the time its checkpoint
        recorded (`stage_clock` in its meta)."""
        before = (stage.resume_meta or {}).get("stage_clock") or {}
        self._stage_clock = (time.time(), compilation.CLOCK.seconds(),
                             float(before.get("wall_s", 0.0)),
                             float(before.get("compile_s", 0.0)))

    def stage_clock(self) -> dict:
        """{wall_s, compile_s} spent in the current stage so far (over every session)."""
        wall, compile_s, wall_before, compile_before = self._stage_clock
        return {"wall_s": round(wall_before + time.time() - wall, 3),
                "compile_s": round(compile_before + compilation.CLOCK.seconds() - compile_s, 3)}

    def finish_stage(self, stage: StageSpec, stage_step: int = 0) -> None:
        """End-of-stage checkpoint holding only the parameters; the stage's times recorded."""
        self.stage_times[stage.name] = {**self.stage_clock(), "steps": int(stage_step)}
        self.global_step += 1
        self.save(stage, {"params": self.params}, stage_step=stage_step, done=True)

    def restore_stage(self, target: dict, step: int | None = None) -> dict:
        """The checkpoint's state (default: latest) restored onto `target`; the saved PRNG
        key becomes the run's key again; a LoRA tree keeps the target's base. Raises
        CorruptCheckpointError when unreadable."""
        step = self.checkpointer.latest_step() if step is None else step
        target, bases = lora.detach_bases(target)  # a LoRA base is rebuilt, never saved
        try:
            state, _ = self.checkpointer.restore(step, target={**target, "rng": self.key})
        except Exception as err:  # noqa: BLE001
            raise CorruptCheckpointError(step, f"{type(err).__name__}: "
                                         f"{(str(err).splitlines() or [''])[0]}") from err
        if not bool(_all_finite(state["params"])):
            raise CorruptCheckpointError(step, "non-finite parameters")
        self.key = state.pop("rng")
        return lora.attach_bases(state, bases)

    def resume_point(self) -> tuple[int, dict | None, str | None]:
        """(first stage to run, meta of an unfinished stage checkpoint, last checkpointed
        stage); restores the parameters of a finished stage (`resume.resume_point`)."""
        return resume.resume_point(self)

    def quarantine(self, step: int, reason: str) -> None:
        """Moves unreadable checkpoint `step` aside (kept for inspection), with one line."""
        where = self.checkpointer.quarantine(step) if parallel.is_primary() else "aside"
        parallel.sync(f"grpo_jax: checkpoint {step} set aside")
        print(f"[grpo_jax] checkpoint {step} is unreadable ({reason}); moved to {where}, "
              "resuming from the previous one", flush=True)

    def close(self) -> None:
        try:
            self.writer.close()
            self.checkpointer.close()
        finally:
            self.lock.release()


def keep_count(config) -> int | None:
    """Checkpoints kept: config.checkpoint.max_to_keep, and at least enough that the
    full-state checkpoint of the extendable stage's last step outlives the checkpoints of
    its end and of the evals after it (so a finished run can be extended)."""
    index = extendable_stage(config)
    after = len(stage_names(config)) - index if index is not None else 0
    keep = config.checkpoint.max_to_keep
    return None if keep is None else max(int(keep), after + 1)


def mesh_devices(config) -> list:
    """The devices the run's (trainer's) mesh spans: the first config.mesh.num_devices (0 =
    all), less the last mesh.rollout_devices of them (`rollout_devices`)."""
    devices = jax.devices()
    count = config.mesh.num_devices
    devices = devices[:count] if count else devices
    return devices[:len(devices) - config.mesh.get("rollout_devices", 0)]


def rollout_devices(config) -> list:
    """The devices that sample the rollouts when config.mesh.rollout_devices R > 0: the last
    R of the run's devices ([] when R is 0: the trainer's mesh samples)."""
    devices = jax.devices()
    count = config.mesh.num_devices
    devices = devices[:count] if count else devices
    rollout = config.mesh.get("rollout_devices", 0)
    return devices[len(devices) - rollout:] if rollout else []
