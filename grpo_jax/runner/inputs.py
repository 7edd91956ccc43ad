"""What a run is built from: its task, tokenizer, prompt bucket and model.init_from's model
config, from the config (a finished run's are rebuilt the same way: `grpo_jax.results`).

`build_inputs(config)` builds the task, model.init_from's model config, the tokenizer and
the prompt bucket once, at start-up, into a frozen `RunInputs` that validation checks the
stages against and the `Run` then uses (nothing is rebuilt). A sentencepiece tokenizer is
trained in the workdir, so its `RunInputs` has no tokenizer and no bucket until the Run
trains it (`with_tokenizer`). A problem is a ConfigError naming the field.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from grpo_jax import tasks as tasks_lib
from grpo_jax import text
from grpo_jax.models import ModelConfig
from grpo_jax.runner.checks import ConfigError
from grpo_jax.runner.model_init import check_checkpoint_files, checkpoint_config
from grpo_jax.runner.prompts import prompt_of, run_tool_schemas
from grpo_jax.runner.tokenizers import build_tokenizer, check_tokenizer, tokenizer_kind

PROMPT_BUCKET_MULTIPLE = 8  # task.prompt_len = 0: the longest prompt rounded up to this


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What start-up builds once and the Run uses as is.

    Attributes:
      task: the task (config.task.name with config.task.kwargs).
      tokenizer: the run's tokenizer; None when it is trained in the workdir
        (sentencepiece), which the Run does first (`with_tokenizer`).
      prompt_len: the prompt bucket (task.prompt_len, or the measured one when it is 0);
        None while the tokenizer is.
      checkpoint_model: model.init_from's ModelConfig (None without model.init_from).
    """

    task: Any
    tokenizer: Any
    prompt_len: int | None
    checkpoint_model: ModelConfig | None

def build_task(config):
    """The task of config.task (ConfigError naming the constructor argument at fault).

    task.kwargs are the named task's constructor arguments. Those it does not take but
    another registered task does are that task's settings (a preset's arithmetic ones when
    `--config.task.name` names another task): they are left out, with one warning line
    naming them, and the task's own defaults apply. One no task takes is an error."""
    try:
        task, foreign = tasks_lib.task_of(config.task.name, config.task.kwargs.to_dict())
        if foreign:  # after the task was built: a failure is its own one line
            print(f"[grpo_jax] warning: task.kwargs {', '.join(foreign)}: task "
                  f"{config.task.name!r} takes no such argument (another task's settings, "
                  "e.g. a preset's); left out", flush=True)
        return task
    except (TypeError, ValueError) as err:
        message, field = str(err), ""
        named = re.match(r"^([A-Za-z_]\w*): ", message)  # "data_dir: ..." names an argument
        if named:
            message, field = message[named.end():], f".{named.group(1)}"
        raise ConfigError(f"task.kwargs{field}: {message}") from None

def train_examples(config, task) -> list:
    """The training problems an RL stage draws its prompts from: the first task.train_size
    of the training split in the order of task.train_seed (optional: fixed across a sweep's
    seeds; default the run's seed), narrowed to the positions in task.train_pick (optional:
    a tuple of indices into those problems) when it is given."""
    seed = int(config.task.get("train_seed", config.seed))
    examples = task.examples("train", config.task.train_size, seed=seed)
    pick = tuple(config.task.get("train_pick", ()))
    return [examples[i] for i in pick] if pick else examples


def eval_seed(config) -> int:
    """The seed of the held-out problems: task.eval_seed (fixed across a sweep's seeds), or
    the run's seed for a config without the field."""
    return int(config.task.get("eval_seed", config.seed))

def prompt_bucket(config, task, tokenizer) -> int:
    """The prompt bucket: task.prompt_len, checked to hold the longest prompt (BOS included)
    of the training and held-out problems; with task.prompt_len = 0 that longest prompt
    rounded up to a multiple of PROMPT_BUCKET_MULTIPLE."""
    examples = []
    for split, field in (("train", "train_size"), ("test", "eval_size")):
        try:
            examples += (task.examples(split, config.task[field], seed=eval_seed(config))
                         if split == "test" else train_examples(config, task))
        except ValueError as err:  # too few problems, or a data file that does not read
            message = str(err)
            in_file = os.path.isfile(message.split(":", 1)[0])  # "<file>:<line>: ..."
            raise ConfigError(f"{'task' if in_file else f'task.{field}'}: {message}") from None
    longest, where = 0, None
    for ex in examples:
        try:
            prompt = prompt_of(config, task, tokenizer, ex)
            length = len(text.prompt_ids(tokenizer, prompt))
        except ValueError as err:  # e.g. a character the char tokenizer does not have
            raise ConfigError(f"task: problem {getattr(ex, 'id', '?')!r}: {err}") from None
        if length > longest:
            longest, where = length, ex
    if not config.task.prompt_len:
        return -(-longest // PROMPT_BUCKET_MULTIPLE) * PROMPT_BUCKET_MULTIPLE
    if longest > config.task.prompt_len:
        raise ConfigError(f"task.prompt_len: {config.task.prompt_len} cannot hold prompt "
                          f"{getattr(where, 'id', '?')!r} of {longest} tokens (with BOS); "
                          f"expected >= {longest} (or 0: measured at start-up)")
    return config.task.prompt_len

def check_answers_match(config, task, tokenizer) -> None:
    """With JSON tools in a chat template, the task's worked solutions write the
    environment's answers as the template's tool turn does (`Task.render_answer`), so that
    pretraining traces look like the episodes."""
    render = getattr(task, "render_answer", None)
    if config.task.template != tasks_lib.templates.CHAT or render is None \
            or run_tool_schemas(config) is None:
        return
    renderer = tokenizer.tool_response_renderer() if tokenizer is not None else None
    if renderer is not None and renderer("x") != render("x"):
        raise ConfigError(f"task.name: {task.name} writes an environment's answer as "
                          f"{render('x')!r} but the chat template writes {renderer('x')!r}: "
                          "its worked solutions would not look like its episodes (for JSON "
                          "calls: task.kwargs.calls='json' and task.chat_template='miniature')")


def with_tokenizer(config, inputs: RunInputs, tokenizer) -> RunInputs:
    """`inputs` with `tokenizer` (trained in the workdir), checked, and its prompt bucket."""
    check_tokenizer(config, tokenizer, inputs.checkpoint_model)
    check_answers_match(config, inputs.task, tokenizer)
    return dataclasses.replace(inputs, tokenizer=tokenizer,
                               prompt_len=prompt_bucket(config, inputs.task, tokenizer))

def build_inputs(config) -> RunInputs:
    """The task, model.init_from's model config, the tokenizer (unless it is trained in the
    workdir) and the prompt bucket of a config whose run-wide fields are checked."""
    task = build_task(config)
    checkpoint_model = checkpoint_config(config) if config.model.init_from else None
    inputs = RunInputs(task, None, None, checkpoint_model)
    if tokenizer_kind(config) != "sentencepiece":  # else trained in the workdir, by the Run
        try:
            tokenizer = build_tokenizer(config, task, None)
        except ValueError as err:
            raise ConfigError(f"tokenizer: {err}") from None
        inputs = with_tokenizer(config, inputs, tokenizer)
    check_checkpoint_files(config)
    return inputs
