"""A run: the stages of `config.stages` (pretrain, sft, rl, ppo, eval, ...) in one workdir.

`train_and_evaluate(config, workdir)`: distributed start -> validation (every field of
every stage, before anything is written; it builds the task, tokenizer and prompt bucket
once) -> the `Run` (those inputs, mesh, policy) -> resume -> each stage -> report.
Checkpoints carry the stage index and step, so running the same command again resumes
where the last one stopped: finished stages are skipped and a stage in progress resumes
from its latest checkpoint with its optimizer and data-iterator state. This is the only
module that imports grpo_jax.stages.
"""

from __future__ import annotations

import copy

import jax
import ml_collections

from grpo_jax import compilation, host_memory, parallel, storage
from grpo_jax.rewards.accuracy import configure_verifier
from grpo_jax.runner import Run, StageSpec, validate
from grpo_jax.runner.model_init import lora_summary, model_config_for
from grpo_jax.runner.checks import mesh_size, stage_names
from grpo_jax.runner.guards import Preempted, StopRequest
from grpo_jax.runner.report import write_run_report
from grpo_jax.runner.resume import CorruptCheckpointError
from grpo_jax.stages import KINDS
from grpo_jax.tools.sandbox import configure_sandbox


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs every stage of `config.stages` in `workdir`; returns the report's figures.

    Raises runner.ConfigError (bad config, before anything is written), Preempted (SIGTERM /
    SIGINT: a checkpoint was written), NonFiniteError and WorkdirBusyError.
    """
    parallel.initialize_distributed()  # before anything touches devices; no-op on one host
    inputs = validate(config, KINDS)  # task, tokenizer, prompt bucket: built once, here
    if "math_verify" in config:
        configure_verifier(deadline_seconds=config.math_verify.deadline_seconds,
                           workers=config.math_verify.workers)
    if "sandbox" in config:
        configure_sandbox(isolation=config.sandbox.isolation)
    if config.get("reuse_host_memory", True):
        host_memory.reuse_freed_memory()  # a no-op when main (or a benchmark) already did
    compilation.use_cache(config.get("compilation_cache_dir", compilation.DEFAULT_CACHE_DIR))
    with StopRequest() as stop:
        try:
            while True:
                run = Run(config, workdir, KINDS, inputs, stop=stop)
                inputs = run.inputs  # with a tokenizer trained in the workdir, once trained
                try:
                    return _run_stages(run)
                except CorruptCheckpointError as err:
                    # A stage could not restore its checkpoint: set it aside, resume from the
                    # one before (the Run is rebuilt, so nothing of the failed attempt
                    # remains).
                    run.quarantine(err.step, err.reason)
                finally:
                    run.close()
        except KeyboardInterrupt as err:
            if stop.received < 2:  # not a second signal (guards.StopRequest)
                raise
            raise Preempted(
                f"[grpo_jax] stopped at once on a {err or 'second signal'}: the last complete "
                f"checkpoint in {storage.join(storage.normalize(workdir), 'checkpoints')} is "
                "where the same command resumes", status=130) from None


def _run_stages(run: Run) -> dict:
    start, resume_meta, last_stage = run.resume_point()
    # The lines logged after the checkpoint resumed from (all of them when there is none: a
    # run killed before its first checkpoint starts again) are logged again.
    run.writer.truncate_after(run.global_step)
    if last_stage is not None:
        if parallel.is_primary():
            print(f"[grpo_jax] {resume_line(run, start, resume_meta)}", flush=True)
    for index, name in enumerate(run.stage_names):
        if index < start:
            continue
        section = run.config[name]
        spec = StageSpec(index, name, section, resume_meta if index == start else None)
        run.begin_stage(spec)
        KINDS[section.kind].run(run, spec)
        took = run.stage_times.get(name) or run.stage_clock()
        print(f"[grpo_jax] stage {name} ({section.kind}) done in {took['wall_s']:.1f}s "
              f"(compiling {took['compile_s']:.1f}s)", flush=True)
        if index + 1 < len(run.stage_names) and run.stop.agreed():
            run.checkpointer.wait()
            raise Preempted(run.stopped_line(f"stage {name}"))
    return write_run_report(run)


def resume_line(run: Run, start: int, resume_meta: dict | None) -> str:
    """What a rerun in an existing workdir continues from, in one line."""
    names = run.stage_names
    where = f"{run.workdir} (checkpoint {run.global_step})"
    if resume_meta is not None:
        stage = names[start]
        return (f"resuming {where}: stage {stage} at step {resume_meta['stage_step']} of "
                f"{run.config[stage].get('steps', '?')}")
    if start >= len(names):
        return f"resuming {where}: every stage has finished; writing the report"
    return f"resuming {where}: {', '.join(names[:start])} finished; starting {names[start]}"


def run_stage(config: ml_collections.ConfigDict, name: str, workdir: str) -> Run:
    """Runs the one stage `name` of `config` in a fresh `workdir` (no resume, no report);
    returns the closed Run (its params, task, tokenizer stay readable)."""
    config = copy.deepcopy(config)
    config.stages = name
    run = Run(config, str(workdir), KINDS, validate(config, KINDS))
    try:
        KINDS[config[name].kind].run(run, StageSpec(0, name, config[name], None))
    finally:
        run.close()
    return run


def _config_text(config: ml_collections.ConfigDict) -> str:
    """The config as plain YAML: tuples as lists, numbers as their own types (ml-collections'
    own text tags tuples as !!python/tuple)."""
    import json

    import yaml

    data = json.loads(config.to_json_best_effort(sort_keys=True))
    return yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True)


def describe(config: ml_collections.ConfigDict) -> str:
    """What `--print_config` prints: the resolved config, the stages (with each kind's
    summary line), the model with its parameter count, the devices and the mesh. Validates
    first; writes nothing."""
    inputs = validate(config, KINDS)
    prompt_len = inputs.prompt_len
    mesh, data_parallel = mesh_size(config)
    lines = ["# resolved config", _config_text(config).rstrip(), "", "# run"]
    lines.append("stages: " + " -> ".join(f"{n} ({config[n].kind})"
                                          for n in stage_names(config)))
    for name in stage_names(config):
        summary = KINDS[config[name].kind].summary
        if summary is not None:
            lines.append(f"{name}: {summary(config[name])}")
    if prompt_len is None:
        lines.append(f"prompt bucket: measured when the {config.tokenizer} tokenizer is "
                     "trained in the workdir")
    else:
        how = "measured: the longest prompt rounded up to 8" if not config.task.prompt_len \
            else "task.prompt_len; every prompt fits"
        lines.append(f"prompt bucket: {prompt_len} tokens ({how})")
    if inputs.checkpoint_model is not None:
        model_config = inputs.checkpoint_model
        source = config.model.init_from
    else:
        vocab = inputs.tokenizer.vocab_size if inputs.tokenizer is not None \
            else config.tokenizer_vocab_size
        model_config = model_config_for(config, vocab)
        source = config.model.name
    lines.append(
        f"model: {source}: {model_config.num_params():,} parameters (vocab "
        f"{model_config.vocab_size}, hidden {model_config.hidden_size}, "
        f"{model_config.num_layers} layers, {model_config.num_heads} heads / "
        f"{model_config.num_kv_heads} kv heads of {model_config.head_dim}, mlp "
        f"{model_config.mlp_size}, {model_config.param_dtype} params, {model_config.dtype} "
        "compute)")
    if lora_summary(config, model_config):
        lines.append(lora_summary(config, model_config))
    devices = jax.devices()
    lines.append(f"devices: {len(devices)} x {devices[0].platform} "
                 f"({devices[0].device_kind}); process {jax.process_index()} of "
                 f"{jax.process_count()}")
    lines.append("mesh: " + ", ".join(f"{k}={v}" for k, v in mesh.items())
                 + f" (batches split over {data_parallel} data-parallel devices)")
    return "\n".join(lines)
