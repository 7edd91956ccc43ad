"""A run: a list of stages (pretrain, sft, rl, eval, ...) sharing one workdir.

`train_and_evaluate(config, workdir)` builds the task, tokenizer and policy, then runs each
stage named in `config.stages`; each stage name is a config section whose `kind` selects the
stage runner. Checkpoints carry the stage index and step, so running the same command again
resumes where the last one stopped (finished stages are skipped, a stage in progress resumes
from its latest checkpoint with its optimizer and data-iterator state).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import jax
import ml_collections
from flax import nnx

from grpo_jax import parallel
from grpo_jax import tasks as tasks_lib
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import MetricWriter
from grpo_jax.models import Transformer, named_config
from grpo_jax.training import Policy

StageRunner = Callable[["Run", "StageSpec"], None]
STAGE_KINDS: dict[str, StageRunner] = {}


def register_stage(kind: str):
    """Decorator: registers a stage runner under `kind` (the section's `kind` field)."""

    def wrap(fn: StageRunner) -> StageRunner:
        STAGE_KINDS[kind] = fn
        return fn

    return wrap


@dataclasses.dataclass
class StageSpec:
    index: int  # position in config.stages
    name: str  # config section name
    section: ml_collections.ConfigDict
    resume_meta: dict | None  # meta of an unfinished checkpoint of this stage, if resuming


class Run:
    """Everything stages share: config, task, tokenizer, policy, params, writer, checkpoints."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        from grpo_jax.config_validation import validate

        self.config = config
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        validate(config)
        self.stage_names = [s.strip() for s in config.stages.split(",") if s.strip()]
        self.task = tasks_lib.get_task(config.task.name, **config.task.kwargs.to_dict())
        self.tokenizer = build_tokenizer(config, self.task, self.workdir)
        parallel.initialize_distributed()  # no-op unless launched multi-process
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

    def place_model(self, model) -> tuple[Policy, Any]:
        """(Policy, params) of an NNX model with its parameters sharded on the run's mesh."""
        model = parallel.shard_model_state(model, self.mesh, self.rules)
        return Policy.from_model(
            model, logprob_chunk_size=self.config.model.get("logprob_chunk_size", 0))

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

    def close(self) -> None:
        self.checkpointer.close()
        self.writer.close()


def mesh_devices(config) -> list:
    """The devices the run's mesh spans: the first config.mesh.num_devices (0 = all)."""
    devices = jax.devices()
    count = config.mesh.get("num_devices", 0)
    return devices[:count] if count else devices


def _axes(axes):
    """Config rule value -> mesh axes: "" or None = replicated, "a,b" = several axes."""
    if axes is None or axes == "":
        return None
    if isinstance(axes, str) and "," in axes:
        return tuple(a.strip() for a in axes.split(","))
    return tuple(axes) if isinstance(axes, (list, tuple)) else axes


def build_tokenizer(config, task, workdir):
    from grpo_jax import text

    if config.tokenizer == "char":
        return text.CharTokenizer.for_task(task)
    if config.tokenizer == "sentencepiece":
        # Trained once on the training problems and their clean solutions, kept in the workdir
        # so a resumed run uses the same vocabulary.
        from grpo_jax.text.sentencepiece import MODEL_FILE

        directory = os.path.join(workdir, "tokenizer")
        if os.path.isfile(os.path.join(directory, MODEL_FILE)):
            return text.SentencePieceTokenizer.load(directory)
        from grpo_jax.tasks import apply_template

        examples = task.examples("train", min(config.task.train_size, 4000), seed=config.seed)
        texts = [apply_template(ex, template=config.task.template) + (ex.solution or "")
                 for ex in examples]
        return text.SentencePieceTokenizer.train(
            texts, directory, vocab_size=config.get("tokenizer_vocab_size", 128))
    raise ValueError(f"tokenizer: unknown tokenizer {config.tokenizer!r}; expected char or "
                     "sentencepiece")


def build_model(config, tokenizer):
    if config.model.init_from:
        from grpo_jax.models import from_pretrained

        model, model_config = from_pretrained(config.model.init_from, dtype=config.model.dtype)
        return model_config, model
    model_config = model_config_for(config, tokenizer)
    model = Transformer(model_config, rngs=nnx.Rngs(config.seed))
    return model_config, model


def model_config_for(config, tokenizer, name: str | None = None):
    """The named model (default config.model.name) sized for the tokenizer and the run."""
    return named_config(
        name or config.model.name,
        vocab_size=tokenizer.vocab_size,
        max_seq_len=config.model.max_seq_len,
        dtype=config.model.dtype,
        param_dtype=config.model.param_dtype,
    )


def _resume_point(run: Run) -> tuple[int, dict | None, str | None]:
    """(first stage to run, meta of an unfinished stage checkpoint, last checkpointed stage)."""
    step = run.checkpointer.latest_step()
    if step is None:
        return 0, None, None
    meta = run.checkpointer.restore_meta(step)
    from grpo_jax.r1 import rebuild_model_for_meta

    rebuild_model_for_meta(run, meta)  # a finished distill stage replaced the model
    run.global_step = int(meta["global_step"])
    run.evals = dict(meta.get("evals", {}))
    if meta["stage_done"]:
        run.params = run.restore_stage({"params": run.params}, step)["params"]
        return int(meta["stage_index"]) + 1, None, meta["stage"]
    return int(meta["stage_index"]), meta, meta["stage"]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs every stage of `config.stages` in `workdir`; returns the report's figures."""
    # Stage runners register themselves on import.
    from grpo_jax import stages  # noqa: F401

    run = Run(config, workdir)
    try:
        start, resume_meta, last_stage = _resume_point(run)
        if last_stage is not None:
            run.writer.truncate_after(run.global_step)
        for index, name in enumerate(run.stage_names):
            if index < start:
                continue
            section = config[name]
            spec = StageSpec(index, name, section,
                             resume_meta if index == start else None)
            t0 = time.time()
            STAGE_KINDS[section.kind](run, spec)
            print(f"[grpo_jax] stage {name} ({section.kind}) done in {time.time() - t0:.1f}s",
                  flush=True)
        return stages.write_run_report(run)
    finally:
        run.close()
