"""The `Run`: everything the stages of one run share.

config, task, tokenizer, mesh, the policy (graph) and its parameters, the metric writer, the
checkpointer, the PRNG key and the global step. Checkpoints carry the stage index and step,
so `resume_point` tells the pipeline which stage to start and whether it resumes mid-way.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
from flax import nnx

from grpo_jax import parallel
from grpo_jax import tasks as tasks_lib
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import MetricWriter
from grpo_jax.models import Transformer
from grpo_jax.runner.build import build_model, build_tokenizer, model_config_for
from grpo_jax.runner.validation import _axes, check_prompt_buckets, stage_names
from grpo_jax.training import Policy


@dataclasses.dataclass
class StageSpec:
    """One entry of config.stages."""

    index: int  # position in config.stages
    name: str  # config section name
    section: ml_collections.ConfigDict
    resume_meta: dict | None  # meta of an unfinished checkpoint of this stage, if resuming


class Run:
    """Everything stages share. Build it after `validation.validate(config, kinds)`."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, kinds):
        self.config, self.kinds = config, kinds
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.stage_names = stage_names(config)
        self.task = tasks_lib.get_task(config.task.name, **config.task.kwargs.to_dict())
        self.tokenizer = build_tokenizer(config, self.task, self.workdir)
        if config.tokenizer != "char":  # validation checked the char tokenizer's buckets
            check_prompt_buckets(config, self.task, self.tokenizer)
        self.mesh = parallel.make_mesh(config.mesh.shape.to_dict(),
                                       devices=mesh_devices(config))
        self.rules = tuple((name, _axes(axes)) for name, axes in config.mesh.rules)
        self.data_sharding = parallel.data_sharding(self.mesh)
        self.model_config, model = build_model(config, self.tokenizer)
        self.policy, self.params = self.place_model(model)
        del model
        self.key = jax.random.key(config.seed)
        self.writer = MetricWriter(self.workdir)
        self.checkpointer = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep
        )
        self.global_step = 0  # checkpoint numbering: +1 per training step and per stage end
        self.evals: dict[str, dict] = {}  # finished eval stages' figures (kept in meta)
        self.extra_meta: dict[str, Any] = {}
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))

    # ------------------------------------------------------------------ the model
    def place_model(self, model) -> tuple[Policy, Any]:
        """(Policy, params) of an NNX model with its parameters sharded on the run's mesh."""
        model = parallel.shard_model_state(model, self.mesh, self.rules)
        return Policy.from_model(model, logprob_chunk_size=self.config.model.logprob_chunk_size)

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
             force: bool = True, **extra) -> None:
        """Checkpoint `state` plus the run's PRNG key under the current global step."""
        self.checkpointer.save(
            self.global_step, state={**state, "rng": self.key},
            meta=self.meta(stage, stage_step=stage_step, done=done, **extra), force=force
        )

    def save_if_due(self, stage: StageSpec, state: dict, *, stage_step: int, total: int,
                    every: int, **extra) -> None:
        """A mid-stage checkpoint every `every` steps (the stage's end has its own)."""
        if every and stage_step % every == 0 and stage_step < total:
            self.save(stage, state, stage_step=stage_step, done=False, **extra)

    def finish_stage(self, stage: StageSpec, stage_step: int = 0) -> None:
        """End-of-stage checkpoint holding only the parameters."""
        self.global_step += 1
        self.save(stage, {"params": self.params}, stage_step=stage_step, done=True)

    def restore_stage(self, target: dict, step: int | None = None) -> dict:
        """The checkpoint's state (default: latest) restored onto `target`; the saved PRNG
        key becomes the run's key again."""
        state, _ = self.checkpointer.restore(step, target={**target, "rng": self.key})
        self.key = state.pop("rng")
        return state

    def resume_point(self) -> tuple[int, dict | None, str | None]:
        """(first stage to run, meta of an unfinished stage checkpoint, last checkpointed
        stage); restores the parameters of a finished stage."""
        step = self.checkpointer.latest_step()
        if step is None:
            return 0, None, None
        meta = self.checkpointer.restore_meta(step)
        if meta.get("model_name"):  # a distill stage made a student the run's model
            self.replace_model(meta["model_name"], seed=self.config.seed)
        self.global_step = int(meta["global_step"])
        self.evals = dict(meta.get("evals", {}))
        if meta["stage_done"]:
            self.params = self.restore_stage({"params": self.params}, step)["params"]
            return int(meta["stage_index"]) + 1, None, meta["stage"]
        return int(meta["stage_index"]), meta, meta["stage"]

    def close(self) -> None:
        self.checkpointer.close()
        self.writer.close()


def mesh_devices(config) -> list:
    """The devices the run's mesh spans: the first config.mesh.num_devices (0 = all)."""
    devices = jax.devices()
    count = config.mesh.num_devices
    return devices[:count] if count else devices
