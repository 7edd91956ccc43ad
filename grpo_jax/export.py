"""Export a run's policy as a Hugging Face checkpoint: safetensors, config.json, tokenizer.

    python -m grpo_jax.export --workdir=runs/gsm8k --out=exports/gsm8k [--stage=rl]
        [--dtype=bfloat16] [--overwrite]

Writes the parameters of the run's latest finished-stage checkpoint (or of the last
checkpoint of stage `--stage`) with `models.save_pretrained` (Qwen2 or Llama layout, the architecture of
model.init_from when the run started from a checkpoint), and next to them the tokenizer's
files (tokenizer.json, tokenizer_config.json with its chat template, chat_template.jinja,
generation_config.json, ...) when the run used a checkpoint's tokenizer, so transformers
and vLLM load the export with its tokenizer. A run with the character tokenizer gets a
tokenizer.json of its vocabulary (`char_tokenizer_json`: one id per character, each tag one
added token, <bos> prepended, <pad> / <bos> / <eos> special), a tokenizer_config.json (with
the run's chat template, if any) and a generation_config.json; a SentencePiece run is
exported without tokenizer files. With a run's own vocabulary (character or SentencePiece),
config.json names its bos / eos / pad ids, so `generate` stops at EOS. Every file is
readable by all (mode 0666 less the umask, as `open` makes it). Every problem is one line on
stderr and exit status 2, before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from grpo_jax.command_line import OneLineParser

__all__ = ["ExportError", "char_tokenizer_json", "export", "main"]


class ExportError(ValueError):
    """The run cannot be exported as asked (the message says why, in one line)."""


def export(workdir: str, out: str, *, stage: str | None = None, dtype: str | None = None,
           overwrite: bool = False) -> str:
    """Writes the run's policy (latest finished stage, or stage `stage`'s last) to `out`.

    Args:
      workdir: a grpo_jax run directory.
      out: the export directory (created; must be empty unless `overwrite`).
      stage: a stage name of the run; None: the latest stage that finished.
      dtype: the dtype of the written tensors ("bfloat16", ...); None: the run's
        parameter dtype.
      overwrite: replace the model and tokenizer files of an existing export in `out`.

    Returns:
      a one-line summary of what was written.

    Raises:
      ExportError: nothing to export, or `out` is not a place to write to.
    """
    from grpo_jax import tasks as tasks_lib
    from grpo_jax.models import save_pretrained
    from grpo_jax.models.hf import dtype_name
    from grpo_jax.runner.model_init import load_run_policy
    from grpo_jax.runner.run_directory import CONFIG_FILE, run_directory_config
    from grpo_jax.runner.tokenizers import build_tokenizer, tokenizer_kind
    from grpo_jax.runner.checks import output_dir_problem

    workdir, out = os.path.abspath(workdir), os.path.abspath(out)
    if not os.path.isfile(os.path.join(workdir, CONFIG_FILE)):
        raise ExportError(f"--workdir: {workdir!r} is not a grpo_jax run directory (no "
                          f"{CONFIG_FILE})")
    try:
        config = run_directory_config(workdir)
    except (OSError, ValueError) as err:  # e.g. config.json cut short or nested too deep
        raise ExportError(f"--workdir: {err}") from None
    if config is None:
        raise ExportError(f"--workdir: no checkpoint in {os.path.join(workdir, 'checkpoints')}"
                          "; train the run first (python -m grpo_jax.main --workdir=...)")
    source = os.path.abspath(config.model.init_from) if config.model.init_from else None
    if out in (workdir, source) or out.startswith(workdir + os.sep):
        raise ExportError(f"--out: {out!r} is inside the run directory or is the "
                          "checkpoint it started from; export to a new directory")
    problem = output_dir_problem(out)
    if problem:
        raise ExportError(f"--out: {problem}; expected a directory to write the export into "
                          "(created when missing)")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise ExportError(f"--out: {out!r} is not empty (pass --overwrite to replace an "
                          "earlier export)")
    if dtype is not None:
        try:
            dtype = dtype_name(dtype, what="--dtype")
        except ValueError as err:
            raise ExportError(str(err)) from None
    kind = tokenizer_kind(config)
    task = None if kind == "checkpoint" else tasks_lib.task_of(
        config.task.name, config.task.kwargs.to_dict())[0]
    tokenizer = build_tokenizer(config, task, workdir)
    try:
        model_config, model, meta, model_type = load_run_policy(
            workdir, stage=stage, tokenizer=tokenizer, dtype=dtype, param_dtype=dtype)
    except FileNotFoundError as err:
        raise ExportError(f"--stage: {err}" if stage else f"--workdir: {err}") from None
    save_pretrained(model, model_config, out, model_type=model_type)
    copied = []
    files = getattr(tokenizer, "files", None)
    for file in (files() if files is not None else []):
        shutil.copyfile(file, os.path.join(out, file.name))
        copied.append(file.name)
    if kind in ("char", "sentencepiece"):
        _write_special_ids(tokenizer, out)
    if kind == "char":
        copied += _write_char_tokenizer(tokenizer, out)
    _readable_by_all(out)
    what = f"tokenizer files {copied}" if copied else (
        f"no tokenizer files (the run's {kind!r} tokenizer has no Hugging Face form)")
    return (f"exported {exported_policy(config, meta)} of {workdir} to {out}: "
            f"{model_config.num_params():,} parameters in {model_config.param_dtype}, {what}")


def char_tokenizer_json(tokenizer):
    """A `tokenizers.Tokenizer` that encodes and decodes as `tokenizer` (a CharTokenizer).

    The model is a BPE without merges over the vocabulary (so each character is its own id);
    the tags are added tokens (one id wherever they appear, kept by `decode`), <pad>, <bos>
    and <eos> special ones (dropped by `decode` with skip_special_tokens); encoding with
    special tokens prepends <bos>, as the run's prompts begin.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    vocab = {tokenizer.id_to_token(i): i for i in range(tokenizer.vocab_size)}
    converted = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    specials = [tokenizer.id_to_token(i) for i in (tokenizer.pad_id, tokenizer.bos_id,
                                                   tokenizer.eos_id)]
    converted.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in specials])
    converted.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in tokenizer.tags])
    converted.decoder = decoders.Fuse()  # characters joined as they are
    bos = specials[1]
    converted.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokenizer.bos_id)])
    return converted


def _write_char_tokenizer(tokenizer, out: str) -> list[str]:
    """tokenizer.json, tokenizer_config.json (with the run's chat template, if any) and
    generation_config.json of a CharTokenizer run; returns the file names."""
    char_tokenizer_json(tokenizer).save(os.path.join(out, "tokenizer.json"))
    pad, bos, eos = (tokenizer.id_to_token(i) for i in (tokenizer.pad_id, tokenizer.bos_id,
                                                        tokenizer.eos_id))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos,
                "eos_token": eos, "pad_token": pad, "clean_up_tokenization_spaces": False}
    template = getattr(tokenizer, "chat_template", None)
    if template:
        settings["chat_template"] = template
    _write_json(os.path.join(out, "tokenizer_config.json"), settings)
    _write_json(os.path.join(out, "special_tokens_map.json"),
                {"bos_token": bos, "eos_token": eos, "pad_token": pad})
    return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "generation_config.json"]


def _write_special_ids(tokenizer, out: str) -> None:
    """bos / eos / pad ids of a run's own vocabulary in config.json and in
    generation_config.json (what `generate` reads to stop)."""
    ids = {"bos_token_id": int(tokenizer.bos_id), "eos_token_id": int(tokenizer.eos_id),
           "pad_token_id": int(tokenizer.pad_id)}
    path = os.path.join(out, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config.update(ids)
    _write_json(path, config)
    _write_json(os.path.join(out, "generation_config.json"), ids)


def _write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _readable_by_all(out: str) -> None:
    """Every file of the export at 0666 less the umask (safetensors writes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~umask)


def exported_policy(config, meta: dict) -> str:
    """Which policy a finished-stage checkpoint holds, in words: the stage that trained it
    (an eval or reward-model stage checkpoints the policy it found), its steps and the
    checkpoint's number."""
    from grpo_jax.runner.checks import stage_names
    from grpo_jax.runner.report import POLICY_KEEPING_KINDS

    stage, number = meta.get("stage"), meta.get("global_step")
    names = stage_names(config)
    if stage not in names:
        return f"checkpoint {number} (stage {stage!r})"
    trained = [n for n in names[:names.index(stage) + 1]
               if config[n].kind not in POLICY_KEEPING_KINDS]
    if not trained:
        return (f"the initial policy (model.init_from or a fresh init; checkpoint {number}, "
                f"written by stage {stage!r}, which does not change it)")
    last = trained[-1]
    steps = config[last].get("steps")
    after = f"the policy after stage {last!r}" + (f" ({steps} steps)" if steps else "")
    if last == stage:
        return f"{after}, checkpoint {number}"
    return f"{after}, checkpoint {number} (written by stage {stage!r}, which does not change it)"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, or 2 with one line on stderr)."""
    parser = OneLineParser(prog="python -m grpo_jax.export", description=__doc__.splitlines()[0])
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
