"""The `Run`: everything the stages of one run share.

config, task, tokenizer, mesh, the policy (graph) and its parameters, the metric writer, the
checkpointer, the PRNG key and the global step. Checkpoints carry the stage index and step,
so `resume_point` tells the pipeline which stage to start and whether it resumes mid-way.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from typing import Any

import jax
import ml_collections
from flax import nnx

from grpo_jax import parallel
from grpo_jax import tasks as tasks_lib
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import MetricWriter
from grpo_jax.models import Transformer
from grpo_jax.runner.build import (CONFIG_FILE, HISTORY_FIELD, build_model, build_tokenizer,
                                   model_config_for)
from grpo_jax.runner.guards import NonFiniteError, Preempted, StopRequest, WorkdirLock
from grpo_jax.runner.validation import (ConfigError, _axes, check_vocabulary, stage_names,
                                        validate)
from grpo_jax.training import Policy, all_finite, default_batch_streams

_all_finite = jax.jit(all_finite)  # one program per parameter structure


@dataclasses.dataclass
class StageSpec:
    """One entry of config.stages."""

    index: int  # position in config.stages
    name: str  # config section name
    section: ml_collections.ConfigDict
    resume_meta: dict | None  # meta of an unfinished checkpoint of this stage, if resuming


class Run:
    """Everything stages share. Build it after `validation.validate(config, kinds)`."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, kinds,
                 stop: StopRequest | None = None, prompt_len: int | None = None):
        self.config, self.kinds = config, kinds
        self.stop = stop  # set while a run is in progress: SIGTERM / SIGINT requests
        self._prompt_len = prompt_len  # the bucket `validate` returned, when it measured it
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.lock = WorkdirLock(self.workdir)
        if jax.process_index() == 0:  # one run per workdir (process 0 holds the lock)
            self.lock.acquire()
        try:
            self._setup(config)
        except BaseException:
            self.lock.release()
            raise

    def _setup(self, config) -> None:
        self.stage_names = stage_names(config)
        self.history = check_config_drift(config, self.workdir)
        self.task = tasks_lib.get_task(config.task.name, **config.task.kwargs.to_dict())
        primary = parallel.is_primary()  # process 0 writes the run's files
        if primary:  # a tokenizer trained in the workdir is trained and saved once
            self.tokenizer = build_tokenizer(config, self.task, self.workdir)
        # Every process has read config.json (above) before process 0 rewrites it, and finds
        # the tokenizer process 0 saved.
        parallel.sync("grpo_jax: config.json read, tokenizer saved")
        if not primary:
            self.tokenizer = build_tokenizer(config, self.task, self.workdir)
        record = json.loads(config.to_json_best_effort())  # as given (prompt_len 0 = auto)
        # The run's config has the measured prompt bucket; a tokenizer trained in the
        # workdir is validated here, with the bucket it gives.
        self.config = config = copy.deepcopy(config)
        if self._prompt_len is None:  # not measured yet, or a tokenizer trained just now
            self._prompt_len = validate(config, self.kinds, tokenizer=self.tokenizer)
        config.task.prompt_len = self._prompt_len
        self.mesh = parallel.make_mesh(config.mesh.shape.to_dict(),
                                       devices=mesh_devices(config))
        self.rules = tuple((name, _axes(axes)) for name, axes in config.mesh.rules)
        self.data_sharding = parallel.data_sharding(self.mesh)
        self.model_config, model = build_model(config, self.tokenizer)
        check_vocabulary(self.tokenizer, self.model_config.vocab_size,
                         config.model.init_from or config.model.name)
        self.policy, self.params = self.place_model(model)
        del model
        # Replicated on the mesh: a multi-controller checkpoint holds only global arrays.
        self.key = jax.jit(lambda: jax.random.key(config.seed),
                           out_shardings=parallel.replicated_sharding(self.mesh))()
        self.writer = MetricWriter(self.workdir, active=primary)
        self.checkpointer = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep
        )
        self.global_step = 0  # checkpoint numbering: +1 per training step and per stage end
        self.evals: dict[str, dict] = {}  # finished eval stages' figures (kept in meta)
        self.extra_meta: dict[str, Any] = {}
        if self.history:
            record[HISTORY_FIELD] = self.history
        if primary:
            with open(os.path.join(self.workdir, CONFIG_FILE), "w") as f:
                json.dump(record, f, indent=2)

    # ------------------------------------------------------------------ the model
    def place_model(self, model) -> tuple[Policy, Any]:
        """(Policy, params) of an NNX model with its parameters sharded on the run's mesh."""
        model = parallel.shard_model_state(model, self.mesh, self.rules)
        streams = self.config.model.batch_streams or default_batch_streams()
        return Policy.from_model(model, logprob_chunk_size=self.config.model.logprob_chunk_size,
                                 batch_streams=streams)

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

    # ------------------------------------------------------------------ keys
    def stage_key(self, stage_index: int, step: int) -> jax.Array:
        """Per-(stage, step) key: a pure function of the seed, so resumes are exact."""
        return jax.random.fold_in(jax.random.fold_in(self.key, stage_index), step)

    # ------------------------------------------------------------------ checkpoints
    def meta(self, stage: StageSpec, *, stage_step: int, done: bool, **extra) -> dict:
        return {
            "stage_index": stage.index,
            "stage": stage.name,
            "stage_step": stage_step,
            "stage_done": done,
            "global_step": self.global_step,
            "evals": self.evals,
            **self.extra_meta,
            **extra,
        }

    def save(self, stage: StageSpec, state: dict, *, stage_step: int, done: bool,
             force: bool = True, **extra) -> bool:
        """Checkpoint `state` plus the run's PRNG key under the current global step (False
        when that step is already saved). Parameters that are not finite are never written."""
        if not bool(_all_finite(state["params"])):
            raise NonFiniteError(f"{stage.name} step {stage_step}: the parameters are not "
                                 "finite; not writing them to a checkpoint")
        return self.checkpointer.save(
            self.global_step, state={**state, "rng": self.key},
            meta=self.meta(stage, stage_step=stage_step, done=done, **extra), force=force
        )

    def save_if_due(self, stage: StageSpec, state: dict, *, stage_step: int, total: int,
                    every: int, **extra) -> None:
        """A mid-stage checkpoint every `every` steps, and a full-state one after the last
        step of the run's last stage (raising its steps later continues from it).

        Then, if a stop was requested (SIGTERM / SIGINT), a checkpoint of this step and
        `Preempted`; at a stage's last step the stage finishes first (the pipeline stops
        between stages)."""
        self.checkpointer.check_errors()  # an asynchronous save failed: stop now
        last = stage.index == len(self.stage_names) - 1
        if (every and stage_step % every == 0 and stage_step < total) or \
                (last and stage_step == total):
            self.save(stage, state, stage_step=stage_step, done=False, **extra)
        if self.stop is not None and self.stop.requested and stage_step < total:
            self.save(stage, state, stage_step=stage_step, done=False, **extra)
            self.checkpointer.wait()
            raise Preempted(self.stopped_line(f"{stage.name} step {stage_step}"))

    def stopped_line(self, where: str) -> str:
        return (f"[grpo_jax] stopped on {self.stop.requested} after {where}: checkpoint "
                f"{os.path.join(self.checkpointer.directory, str(self.global_step))}; run the "
                "same command to resume")

    def finish_stage(self, stage: StageSpec, stage_step: int = 0) -> None:
        """End-of-stage checkpoint holding only the parameters."""
        self.global_step += 1
        self.save(stage, {"params": self.params}, stage_step=stage_step, done=True)

    def restore_stage(self, target: dict, step: int | None = None) -> dict:
        """The checkpoint's state (default: latest) restored onto `target`; the saved PRNG
        key becomes the run's key again. Raises CorruptCheckpointError when unreadable."""
        step = self.checkpointer.latest_step() if step is None else step
        try:
            state, _ = self.checkpointer.restore(step, target={**target, "rng": self.key})
        except Exception as err:  # noqa: BLE001
            raise CorruptCheckpointError(step, f"{type(err).__name__}: "
                                         f"{(str(err).splitlines() or [''])[0]}") from err
        if not bool(_all_finite(state["params"])):
            raise CorruptCheckpointError(step, "non-finite parameters")
        self.key = state.pop("rng")
        return state

    def resume_point(self) -> tuple[int, dict | None, str | None]:
        """(first stage to run, meta of an unfinished stage checkpoint, last checkpointed
        stage); restores the parameters of a finished stage.

        A finished last stage whose `steps` were raised (an extension) resumes from its
        full-state checkpoint after its old last step. A checkpoint that cannot be read is
        moved aside (`Checkpointer.quarantine`) with one line, and the next older one used.
        """
        while True:
            step = self.checkpointer.latest_step()
            if step is None:
                return 0, None, None
            try:
                meta = self.checkpointer.restore_meta(step)
                extension = self._extension_meta(meta)
                if extension is not None:
                    return self._resume_from(extension)
                if meta["stage_done"]:
                    self._adopt(meta)
                    self.params = self.restore_stage({"params": self.params}, step)["params"]
                    return int(meta["stage_index"]) + 1, None, meta["stage"]
                return self._resume_from(meta)
            except CorruptCheckpointError as err:
                self.quarantine(err.step, err.reason)
            except ConfigError:
                raise
            except Exception as err:  # noqa: BLE001  (unreadable meta or arrays)
                self.quarantine(step, f"{type(err).__name__}: {str(err).splitlines()[0]}"
                                if str(err) else type(err).__name__)

    def _adopt(self, meta: dict) -> None:
        if meta.get("model_name"):  # a distill stage made a student the run's model
            self.replace_model(meta["model_name"], seed=self.config.seed)
        self.global_step = int(meta["global_step"])
        self.evals = dict(meta.get("evals", {}))

    def _resume_from(self, meta: dict):
        self._adopt(meta)
        return int(meta["stage_index"]), meta, meta["stage"]

    def _extension_meta(self, meta: dict) -> dict | None:
        """The full-state checkpoint to continue from when the finished last stage's steps
        were raised; None when this is not an extension."""
        last = len(self.stage_names) - 1
        if not (meta["stage_done"] and int(meta["stage_index"]) == last):
            return None
        section = self.config[self.stage_names[last]]
        if int(section.get("steps", 0) or 0) <= int(meta["stage_step"]):
            return None
        for step in reversed(self.checkpointer.all_steps()):
            candidate = self.checkpointer.restore_meta(step)
            if (candidate["stage_index"] == last and not candidate["stage_done"]
                    and candidate["stage_step"] == meta["stage_step"]):
                for later in [s for s in self.checkpointer.all_steps() if s > step]:
                    self.checkpointer.delete(later)  # the old end of the stage
                return candidate
        raise ConfigError(
            f"{self.stage_names[last]}.steps: the run has no full-state checkpoint after its "
            f"step {meta['stage_step']} to continue from (checkpoint.max_to_keep too small?)")

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


class CorruptCheckpointError(RuntimeError):
    """A checkpoint could not be restored."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"checkpoint {step}: {reason}")
        self.step, self.reason = step, reason


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


# Fields that do not change what a run computes: a resume may set them differently.
NOT_RESULTS = ("compilation_cache_dir", "reuse_host_memory")


def check_config_drift(config, workdir: str) -> list:
    """Compares the config with the one of the run already in `workdir` (if it has
    checkpoints); returns config.json's history for the new config.json.

    Any difference is a ConfigError listing the fields, except raising the last stage's
    `steps` (an extension: the run continues that stage, and the change is recorded in
    config.json's history)."""
    path = os.path.join(workdir, CONFIG_FILE)
    checkpoints = os.path.join(workdir, "checkpoints")
    if not os.path.isfile(path) or not os.path.isdir(checkpoints) or not any(
            name.isdigit() for name in os.listdir(checkpoints)):
        return []
    with open(path) as f:
        old = json.load(f)
    history = old.pop(HISTORY_FIELD, [])
    before, after = _flatten(old), _flatten(json.loads(config.to_json_best_effort()))
    changed = {k: (before.get(k, "<absent>"), after.get(k, "<absent>"))
               for k in sorted(set(before) | set(after))
               if before.get(k) != after.get(k) and k not in NOT_RESULTS}
    if not changed:
        return history
    names = stage_names(config)
    extension = f"{names[-1]}.steps"
    if set(changed) == {extension} and isinstance(changed[extension][0], int) \
            and changed[extension][1] > changed[extension][0]:
        return history + [{"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "changed": {extension: list(changed[extension])}}]
    shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in list(changed.items())[:8])
    more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
    raise ConfigError(
        f"config: differs from the run in {workdir}: {shown}{more}; use another --workdir "
        f"(only raising {extension} continues this run)")


def mesh_devices(config) -> list:
    """The devices the run's mesh spans: the first config.mesh.num_devices (0 = all)."""
    devices = jax.devices()
    count = config.mesh.num_devices
    return devices[:count] if count else devices
