"""Export a run's policy as a Hugging Face checkpoint: safetensors, config.json, tokenizer.

    python -m grpo_jax.export --workdir=runs/gsm8k --out=exports/gsm8k [--stage=rl]
        [--dtype=bfloat16] [--overwrite]

Writes the parameters of the run's latest checkpoint (or of the last checkpoint of stage
`--stage`) with `models.save_pretrained` (Qwen2 or Llama layout, the architecture of
model.init_from when the run started from a checkpoint), and next to them the tokenizer's
files (tokenizer.json, tokenizer_config.json with its chat template, chat_template.jinja,
generation_config.json, ...) when the run used a checkpoint's tokenizer, so transformers
and vLLM load the export with its tokenizer. A run with the character or SentencePiece
tokenizer is exported without tokenizer files (they have no Hugging Face form here).
Every problem is one line on stderr and exit status 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import ml_collections

__all__ = ["ExportError", "export", "main"]


class ExportError(ValueError):
    """The run cannot be exported as asked (the message says why, in one line)."""


def _run_config(workdir: str) -> ml_collections.ConfigDict:
    from grpo_jax.runner.run import CONFIG_FILE, HISTORY_FIELD

    file = os.path.join(workdir, CONFIG_FILE)
    if not os.path.isfile(file):
        raise ExportError(f"--workdir: {workdir!r} is not a grpo_jax run directory (no "
                          f"{CONFIG_FILE})")
    with open(file, encoding="utf-8") as f:
        record = json.load(f)
    record.pop(HISTORY_FIELD, None)
    return ml_collections.ConfigDict(record)


def _checkpoint_step(checkpointer, stage: str | None) -> tuple[int, dict]:
    steps = checkpointer.all_steps()
    if not steps:
        raise ExportError(f"--workdir: no checkpoint in {checkpointer.directory}; train the "
                          "run first (python -m grpo_jax.main --workdir=...)")
    if stage is None:
        return steps[-1], checkpointer.restore_meta(steps[-1])
    seen = []
    for step in reversed(steps):
        meta = checkpointer.restore_meta(step)
        seen.append(meta.get("stage"))
        if meta.get("stage") == stage:
            return step, meta
    raise ExportError(f"--stage: no checkpoint of stage {stage!r} is kept in "
                      f"{checkpointer.directory} (kept: {sorted(set(map(str, seen)))}; "
                      "checkpoint.max_to_keep bounds how many are kept)")


def _model_config(config, tokenizer, meta):
    from grpo_jax.runner.build import model_config_for

    if config.model.init_from:
        from grpo_jax.models.hf import config_from_hf

        with open(os.path.join(config.model.init_from, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
        return (config_from_hf(hf, dtype=config.model.dtype,
                               param_dtype=config.model.param_dtype,
                               path=config.model.init_from), hf.get("model_type"))
    return model_config_for(config, tokenizer.vocab_size, meta.get("model_name")), None


def export(workdir: str, out: str, *, stage: str | None = None, dtype: str | None = None,
           overwrite: bool = False) -> str:
    """Writes the run's policy (latest checkpoint, or stage `stage`'s last) to `out`.

    Args:
      workdir: a grpo_jax run directory.
      out: the export directory (created; must be empty unless `overwrite`).
      stage: a stage name of the run; None: the latest checkpoint.
      dtype: the dtype of the written tensors ("bfloat16", ...); None: the run's
        parameter dtype.
      overwrite: replace the model and tokenizer files of an existing export in `out`.

    Returns:
      a one-line summary of what was written.

    Raises:
      ExportError: nothing to export, or `out` is not a place to write to.
    """
    import jax.numpy as jnp
    from flax import nnx

    from grpo_jax import tasks as tasks_lib
    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.models import Transformer, save_pretrained
    from grpo_jax.models.hf import dtype_name
    from grpo_jax.runner.build import build_tokenizer, tokenizer_kind

    workdir, out = os.path.abspath(workdir), os.path.abspath(out)
    config = _run_config(workdir)
    source = os.path.abspath(config.model.init_from) if config.model.init_from else None
    if out in (workdir, source) or out.startswith(workdir + os.sep):
        raise ExportError(f"--out: {out!r} is inside the run directory or is the "
                          "checkpoint it started from; export to a new directory")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise ExportError(f"--out: {out!r} is not empty (pass --overwrite to replace an "
                          "earlier export)")
    if dtype is not None:
        try:
            dtype = dtype_name(dtype, what="--dtype")
        except ValueError as err:
            raise ExportError(str(err)) from None
    checkpoints = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(checkpoints):
        raise ExportError(f"--workdir: no checkpoint in {checkpoints}; train the run first "
                          "(python -m grpo_jax.main --workdir=...)")
    kind = tokenizer_kind(config)
    task = None if kind == "checkpoint" else tasks_lib.get_task(
        config.task.name, **config.task.kwargs.to_dict())
    tokenizer = build_tokenizer(config, task, workdir)
    with Checkpointer(checkpoints) as checkpointer:
        step, meta = _checkpoint_step(checkpointer, stage)
        state, _ = checkpointer.restore(step)
    model_config, model_type = _model_config(config, tokenizer, meta)
    model_config = model_config.replace(value_head="value_kernel" in state["params"])
    if dtype is not None:
        model_config = model_config.replace(param_dtype=dtype, dtype=dtype)
    params = _cast_floats(state["params"], jnp.dtype(model_config.param_dtype))
    model = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
    graph_state = nnx.state(model)
    nnx.replace_by_pure_dict(graph_state, params)
    nnx.update(model, graph_state)
    save_pretrained(model, model_config, out, model_type=model_type)
    copied = []
    if kind == "checkpoint":
        for file in tokenizer.files():
            shutil.copyfile(file, os.path.join(out, file.name))
            copied.append(file.name)
    what = f"tokenizer files {copied}" if copied else (
        f"no tokenizer files (the run's {kind!r} tokenizer has no Hugging Face form)")
    return (f"exported {meta.get('stage')!r} step {meta.get('stage_step')} (checkpoint "
            f"{step}) of {workdir} to {out}: {model_config.num_params():,} parameters in "
            f"{model_config.param_dtype}, {what}")


def _cast_floats(tree, dtype):
    """Every floating leaf of `tree` as `dtype` (integer leaves unchanged)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(
        lambda x: jnp.asarray(x).astype(dtype)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) else x, tree)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, or 2 with one line on stderr)."""
    parser = _Parser(prog="python -m grpo_jax.export", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="the run directory")
    parser.add_argument("--out", required=True, help="the export directory")
    parser.add_argument("--stage", default=None, help="export this stage's last checkpoint")
    parser.add_argument("--dtype", default=None, help="tensor dtype (default: the run's)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # a usage error (one line, printed) or --help
        return int(exit_.code or 0)
    try:
        print(export(args.workdir, args.out, stage=args.stage, dtype=args.dtype,
                     overwrite=args.overwrite))
    except (ExportError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
