"""Start-up validation of a run config: each problem is one line naming the field.

`validate(config, kinds)` runs before the workdir is touched and before any stage: the
run-wide sections (task, tokenizer, model, mesh, optim, checkpoint), then every stage
named in `config.stages` (its fields against its kind's default section, then the kind's
own `validate(check)`). `prompt_bucket` (every training and held-out prompt fits
task.prompt_len, or the bucket when it is 0 = auto) runs here for the char and checkpoint
tokenizers and in the Run for a tokenizer trained in the workdir, which then validates
again with the measured bucket.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from typing import Any, Sequence

import jax
import ml_collections

from grpo_jax import parallel
from grpo_jax import tasks as tasks_lib
from grpo_jax.models.config import _DTYPES, available_models
from grpo_jax.runner import rewards as rewards_lib
from grpo_jax.runner.build import (MODEL_SHAPE_FIELDS, TOKENIZERS, policy_meta,
                                   build_tokenizer, model_config_for, run_directory_config,
                                   run_model_config, tokenizer_kind)

TEMPLATES = ("plain", "r1_zero", "chat")
PROMPT_BUCKET_MULTIPLE = 8  # task.prompt_len = 0: the longest prompt rounded up to this


class ConfigError(ValueError):
    """A config field has a value the run cannot use (the message names the field)."""


def stage_names(config) -> list[str]:
    return [s.strip() for s in str(config.stages).split(",") if s.strip()]


def _type_name(value) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
        return "a mapping"
    return type(value).__name__


class Fields:
    """Checks on the fields of one config node; each error names `<prefix>.<field>`."""

    def __init__(self, node, prefix: str):
        self.node, self.prefix = node, prefix

    def fail(self, field: str, message: str):
        raise ConfigError(f"{self.prefix}.{field}: {message}" if field else
                          f"{self.prefix}: {message}")

    def value(self, field: str):
        if field not in self.node:
            self.fail(field, "missing field")
        return self.node[field]

    def integer(self, field: str, *, low: int | None = 1, high: int | None = None) -> int:
        value = self.value(field)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, f"expected an int, got {value!r}")
        if low is not None and value < low:
            self.fail(field, f"expected >= {low}, got {value}")
        if high is not None and value > high:
            self.fail(field, f"expected <= {high}, got {value}")
        return value

    def number(self, field: str, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
        value = self.value(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(field, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            self.fail(field, f"expected a finite number, got {value}")
        left = "(" if low_open or low is None else "["
        right = ")" if high_open or high is None else "]"
        interval = (f"{left}{low if low is not None else '-inf'}, "
                    f"{high if high is not None else 'inf'}{right}")
        if low is not None and (value < low or (low_open and value == low)):
            self.fail(field, f"expected a value in {interval}, got {value}")
        if high is not None and (value > high or (high_open and value == high)):
            self.fail(field, f"expected a value in {interval}, got {value}")
        return float(value)

    def positive(self, field: str) -> float:
        return self.number(field, low=0.0, low_open=True)

    def choice(self, field: str, options: Sequence[Any]):
        value = self.value(field)
        if value not in options:
            self.fail(field, f"expected one of {list(options)}, got {value!r}")
        return value

    def boolean(self, field: str) -> bool:
        value = self.value(field)
        if not isinstance(value, bool):
            self.fail(field, f"expected True or False, got {value!r}")
        return value

    def string(self, field: str) -> str:
        value = self.value(field)
        if not isinstance(value, str):
            self.fail(field, f"expected a string, got {value!r}")
        return value


class SectionCheck(Fields):
    """Checks on one stage section, with what the section's constraints depend on.

    Attributes:
      name: the section's name in config.stages.
      section: the section.
      config: the whole run config.
      data_parallel: devices the batch is split over (mesh data x fsdp): every batch
        that reaches a device must divide into it.
      task: the run's task (for reward names).
      kinds: the stage-kind registry.
      earlier: (name, kind) of the stages before this one, in run order.
      prompt_len: the prompt bucket (None when the tokenizer is trained in the workdir).
      tokenizer: the run's tokenizer (None likewise).
    """

    def __init__(self, name, section, *, config, data_parallel, task, kinds, earlier,
                 prompt_len=None, tokenizer=None):
        super().__init__(section, name)
        self.name, self.section, self.config = name, section, config
        self.data_parallel, self.task, self.kinds = data_parallel, task, kinds
        self.earlier = earlier
        self.prompt_len = prompt_len  # the prompt bucket; None until measured (the Run)
        self.tokenizer = tokenizer  # the run's tokenizer; None until built (the Run)

    def divides(self, field: str, rows: int, *, micro_field: str | None = "micro_batches",
                what: str = "") -> None:
        """`rows` splits into micro_batches x data-parallel devices (the error names
        `field`)."""
        micro = self.integer(micro_field) if micro_field else 1
        if rows % (micro * self.data_parallel):
            by = (f"micro_batches x data-parallel devices = {micro} x {self.data_parallel}"
                  if micro_field else f"the {self.data_parallel} data-parallel devices")
            self.fail(field, f"{what or rows} is not divisible by {by}")

    def rl_loop_fields(self) -> int:
        """The fields `runner.rl_loop` and `toolkit.section_sampling` read: steps,
        num_prompts, top_k, top_p, max_new_tokens (fits the context), rewards,
        checkpoint_every. Returns max_new_tokens."""
        self.integer("steps")
        self.integer("num_prompts")
        self.integer("top_k", low=0)
        self.number("top_p", low=0.0, high=1.0, low_open=True)
        new = self.fits_context("max_new_tokens")
        self.rewards()
        self.integer("checkpoint_every", low=0)
        return new

    def minibatches(self) -> None:
        """The rollout batch (num_prompts x group_size rows) splits into num_minibatches,
        and each minibatch into micro_batches x data-parallel devices."""
        rows = self.section.num_prompts * self.section.group_size
        if rows % self.integer("num_minibatches"):
            self.fail("num_minibatches", f"rollout batch N*G = {rows} is not divisible by "
                                         f"{self.section.num_minibatches}")
        per_mb = rows // self.section.num_minibatches
        self.divides("micro_batches", per_mb, what=f"minibatch of {per_mb} rows")

    def fits_context(self, field: str = "max_new_tokens") -> int:
        """prompt bucket + `field` tokens fit the model's context length."""
        new = self.integer(field)
        prompt_len, context = self.prompt_len, self.config.model.max_seq_len
        if prompt_len is not None and prompt_len + new > context:
            bucket = (f"task.prompt_len {prompt_len}" if self.config.task.prompt_len else
                      f"the measured prompt bucket {prompt_len} (task.prompt_len = 0)")
            self.fail(field, f"{bucket} + {field} {new} exceeds model.max_seq_len {context}")
        return new

    def pack_len(self, field: str = "pack_len") -> int:
        """0 (one example per row) or a packed row length within the model's context."""
        value = self.integer(field, low=0)
        context = self.config.model.max_seq_len
        if value and value > context:
            self.fail(field, f"{value} exceeds model.max_seq_len {context}")
        return value

    def rewards(self, field: str = "rewards") -> dict:
        """Known reward names with finite weights; "reward_model" needs its source."""
        rewards = self.value(field)
        if len(rewards) == 0:
            self.fail(field, "expected at least one reward")
        known = rewards_lib.available_rewards(self.task, self.kinds)
        for reward, weight in dict(rewards).items():
            if reward not in known:
                close = difflib.get_close_matches(reward, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.fail(f"{field}.{reward}", f"unknown reward{hint}; available: {known}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                    or not math.isfinite(weight):
                self.fail(f"{field}.{reward}", f"expected a finite weight, got {weight!r}")
        if "reward_model" in rewards:
            self.reward_model_source("reward_model")
        return dict(rewards)

    def reward_model_source(self, field: str) -> None:
        """`field` names an earlier reward_model stage or a directory holding one."""
        source = self.string(field) if field in self.section else ""
        if not source:
            self.fail(field, "the reward 'reward_model' needs the name of a reward_model "
                             "stage (or a directory holding one)")
        if os.path.isabs(source):
            if not os.path.isdir(source):
                self.fail(field, f"no reward model directory {source!r}")
            return
        earlier = dict(self.earlier)
        if earlier.get(source) != "reward_model":
            self.fail(field, f"{source!r} is not an earlier stage of kind reward_model in "
                             f"stages (earlier: {list(earlier)})")


def _check_fields_against_default(check: SectionCheck, default) -> None:
    """The section has exactly the kind's fields, each of the default's type."""
    section, kind = check.section, check.section.kind
    have, want = set(section.keys()), set(default.keys())
    missing, extra = sorted(want - have), sorted(have - want)
    start = f"start from grpo_jax.stages.default_section({kind!r})"
    if extra and missing:
        check.fail("kind", f"this section's fields are not those of a {kind!r} stage "
                           f"(unknown: {extra}; missing: {missing}); {start}")
    if extra:
        close = difflib.get_close_matches(extra[0], sorted(want), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        check.fail(extra[0], f"unknown field for a {kind!r} stage{hint}"
                   + (f"; other unknown fields: {extra[1:]}" if extra[1:] else ""))
    if missing:
        check.fail("kind", f"a {kind!r} section needs the fields {missing}; {start}")
    for field in sorted(want):
        expected, value = default[field], section[field]
        if isinstance(expected, bool):
            ok = isinstance(value, bool)
        elif isinstance(expected, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(expected, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif isinstance(expected, str):
            ok = isinstance(value, str)
        elif isinstance(expected, (ml_collections.ConfigDict, dict)):
            ok = isinstance(value, (ml_collections.ConfigDict, dict))
        else:
            ok = True
        if not ok:
            check.fail(field, f"expected {_type_name(expected)}, got {value!r}")


def validate_model(config, vocab_size: int = 256):
    """config.model: a known name, dtypes, and a shape ModelConfig accepts. Returns the
    ModelConfig of model.init_from (None without one)."""
    model = Fields(config.model, "model")
    model.string("name")
    if not config.model.init_from:
        model.choice("name", available_models())
    model.choice("dtype", _DTYPES)
    model.choice("param_dtype", _DTYPES)
    model.integer("max_seq_len", low=2)
    model.integer("logprob_chunk_size", low=0)
    model.integer("batch_streams", low=0)
    if config.model.init_from:
        checkpoint_model = checkpoint_config(config)
        for field in MODEL_SHAPE_FIELDS:
            if field != "remat" and config.model.get(field) is not None:
                model.fail(field, "the shape comes from model.init_from's config.json; only "
                                  "model.remat may be set with it")
        if config.model.get("remat") is not None:
            model.boolean("remat")
        return checkpoint_model
    for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "mlp_size"):
        if config.model.get(field) is not None:
            model.integer(field)
    for field in ("rope_theta", "rms_norm_eps"):
        if config.model.get(field) is not None:
            model.positive(field)
    try:
        model_config_for(config, vocab_size)
    except ValueError as err:
        message = str(err)
        for field in MODEL_SHAPE_FIELDS + ("max_seq_len", "dtype", "param_dtype"):
            if message.startswith(f"ModelConfig.{field}"):
                raise ConfigError("model." + message[len("ModelConfig."):]) from None
        raise ConfigError(f"model: {message}") from None


def checkpoint_config(config):
    """The ModelConfig of model.init_from: a Hugging Face checkpoint's config.json, or the
    policy of a grpo_jax run directory (ConfigError naming the field)."""
    from grpo_jax.models.hf import config_from_hf

    path = config.model.init_from
    base = run_directory_config(path)
    if base is not None:
        try:
            base_task = tasks_lib.get_task(base.task.name, **base.task.kwargs.to_dict())
            tokenizer = build_tokenizer(base, base_task, path)
            model_config, _ = run_model_config(base, tokenizer, policy_meta(path))
        except (FileNotFoundError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"model.init_from: {err}") from None
        if config.model.max_seq_len > model_config.max_seq_len:
            raise ConfigError(f"model.max_seq_len: {config.model.max_seq_len} exceeds the "
                              f"base run's context {model_config.max_seq_len}")
        return model_config
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise ConfigError(f"model.init_from: {path!r} is neither a Hugging Face checkpoint "
                          "directory (config.json) nor a grpo_jax run directory (config.json "
                          "and checkpoints/); download the checkpoint beforehand, there is "
                          "no network access at run time")
    try:
        with open(file, encoding="utf-8") as f:
            hf = json.load(f)
        model_config = config_from_hf(hf, dtype=config.model.dtype,
                                      param_dtype=config.model.param_dtype, path=path)
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"model.init_from: {err}") from None
    if config.model.max_seq_len > model_config.max_seq_len:
        raise ConfigError(f"model.max_seq_len: {config.model.max_seq_len} exceeds the "
                          f"checkpoint's max_position_embeddings {model_config.max_seq_len}")
    return model_config


def run_tokenizer(config, task, checkpoint_model=None):
    """The run's tokenizer where it can be built without a workdir (None for sentencepiece,
    trained in the workdir), checked against the model's vocabulary (`checkpoint_model`:
    model.init_from's ModelConfig, when already read) and the template."""
    kind = tokenizer_kind(config)
    if kind == "checkpoint":
        if not config.model.init_from:
            raise ConfigError("tokenizer: 'checkpoint' needs model.init_from (a local Hugging "
                              "Face checkpoint directory with tokenizer.json)")
        if not os.path.isfile(os.path.join(config.model.init_from, "tokenizer.json")):
            raise ConfigError(
                f"model.init_from: {config.model.init_from!r} has no tokenizer.json for "
                "tokenizer=checkpoint; copy the checkpoint's tokenizer files (tokenizer.json, "
                "tokenizer_config.json) into it")
    if config.task.template == "chat" and kind != "checkpoint":
        raise ConfigError(f"task.template: 'chat' renders the checkpoint's chat template and "
                          f"needs tokenizer=checkpoint, got {kind!r}")
    try:
        tokenizer = build_tokenizer(config, task, None)
    except ValueError as err:
        raise ConfigError(f"tokenizer: {err}") from None
    if tokenizer is None:
        return None
    if config.task.template == "chat" and tokenizer.chat_template is None:
        raise ConfigError(f"task.template: 'chat': {config.model.init_from!r} has no chat "
                          "template (tokenizer_config.json chat_template or "
                          "chat_template.jinja); use r1_zero or plain")
    if config.model.init_from:
        checkpoint_model = checkpoint_model or checkpoint_config(config)
        check_vocabulary(tokenizer, checkpoint_model.vocab_size, config.model.init_from)
    return tokenizer


def check_vocabulary(tokenizer, vocab_size: int, source: str) -> None:
    """Every id of the tokenizer has a row in the model's embedding."""
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError(
            f"tokenizer: its ids reach {tokenizer.vocab_size - 1} but the model "
            f"({source}) has a vocabulary of {vocab_size} rows; use the checkpoint's own "
            "tokenizer (tokenizer=checkpoint)")


def mesh_size(config) -> tuple[dict, int]:
    """(resolved mesh shape, data-parallel size = data x fsdp); ConfigError when unusable."""
    mesh = Fields(config.mesh, "mesh")
    count = mesh.integer("num_devices", low=0, high=jax.device_count())
    try:
        shape = parallel.resolve_mesh_shape(config.mesh.shape.to_dict(),
                                            count or jax.device_count())
    except ValueError as err:
        raise ConfigError(f"mesh.shape: {err}") from None
    return shape, shape["data"] * shape["fsdp"]


def validate(config: ml_collections.ConfigDict, kinds, tokenizer=None) -> int | None:
    """Raises ConfigError with one line for the first invalid field of a run config.

    Args:
      config: the run config.
      kinds: the stage-kind registry.
      tokenizer: the run's tokenizer when already built (the Run passes one trained in
        its workdir); None builds it where no workdir is needed.

    Returns:
      the prompt bucket (task.prompt_len, or the measured one when it is 0); None when the
      tokenizer is trained in the workdir and not given.
    """
    names = stage_names(config)
    if not names:
        raise ConfigError("stages: expected a comma-separated list of section names")
    seen = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"stages: {name!r} is listed twice; give each stage its own "
                              "section")
        seen.add(name)
        if name not in config or not isinstance(config[name], ml_collections.ConfigDict):
            raise ConfigError(f"stages: {name!r} has no config section config.{name}")
        if config[name].get("kind") not in kinds:
            raise ConfigError(f"{name}.kind: expected one of {sorted(kinds)}, got "
                              f"{config[name].get('kind')!r}")
    top = Fields(config, "config")
    top.integer("seed", low=0)
    top.integer("max_consecutive_skips")
    if "compilation_cache_dir" in config:
        top.string("compilation_cache_dir")
    if "reuse_host_memory" in config:
        top.boolean("reuse_host_memory")

    task = Fields(config.task, "task")
    task.choice("name", tasks_lib.available_tasks())
    task.choice("template", TEMPLATES)
    if task.integer("prompt_len", low=0) == 1:
        task.fail("prompt_len", "expected 0 (auto: the longest prompt, measured at start-up) "
                                "or >= 2, got 1")
    task.integer("train_size")
    task.integer("eval_size")
    task.number("solution_error_rate", low=0.0, high=1.0)
    task.number("format_error_rate", low=0.0, high=1.0)
    try:
        task_obj = tasks_lib.get_task(config.task.name, **config.task.kwargs.to_dict())
    except (TypeError, ValueError) as err:
        message, field = str(err), ""
        for name in config.task.kwargs:  # "data_dir: ..." names a constructor argument
            if message.startswith(f"{name}: "):
                message, field = message[len(name) + 2:], f".{name}"
        raise ConfigError(f"task.kwargs{field}: {message}") from None

    top.choice("tokenizer", TOKENIZERS)
    top.integer("tokenizer_vocab_size", low=8)
    checkpoint_model = validate_model(config)
    if tokenizer is None:
        tokenizer = run_tokenizer(config, task_obj, checkpoint_model)
    prompt_len = prompt_bucket(config, task_obj, tokenizer) if tokenizer is not None else None
    _, data_parallel = mesh_size(config)
    try:
        parallel.validate_rules(tuple((n, _axes(a)) for n, a in config.mesh.rules))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"mesh.rules: {err}") from None

    optim = Fields(config.optim, "optim")
    optim.number("weight_decay", low=0.0)
    optim.number("b1", low=0.0, high=1.0, high_open=True)
    optim.number("b2", low=0.0, high=1.0, high_open=True)
    optim.number("clip_norm", low=0.0)
    optim.number("warmup_frac", low=0.0, high=1.0)
    optim.number("final_lr_frac", low=0.0, high=1.0)
    Fields(config.checkpoint, "checkpoint").integer("max_to_keep")

    earlier = []
    for name in names:
        section = config[name]
        kind = kinds[section.kind]
        check = SectionCheck(name, section, config=config, data_parallel=data_parallel,
                             task=task_obj, kinds=kinds, earlier=list(earlier),
                             prompt_len=prompt_len, tokenizer=tokenizer)
        _check_fields_against_default(check, kind.default_section())
        if kind.validate is not None:
            kind.validate(check)
        earlier.append((name, section.kind))
    return prompt_len


def _axes(axes):
    """Config rule value -> mesh axes: "" or None = replicated, "a,b" = several axes."""
    if axes is None or axes == "":
        return None
    if isinstance(axes, str) and "," in axes:
        return tuple(a.strip() for a in axes.split(","))
    return tuple(axes) if isinstance(axes, (list, tuple)) else axes


def prompt_bucket(config, task, tokenizer) -> int:
    """The prompt bucket: task.prompt_len, checked to hold the longest prompt (BOS included)
    of the training and held-out problems; with task.prompt_len = 0 that longest prompt
    rounded up to a multiple of PROMPT_BUCKET_MULTIPLE."""
    from grpo_jax.text import prompt_ids

    template = config.task.template
    examples = []
    for split, field in (("train", "train_size"), ("test", "eval_size")):
        try:
            examples += task.examples(split, config.task[field], seed=config.seed)
        except ValueError as err:
            raise ConfigError(f"task.{field}: {err}") from None
    longest, where = 0, None
    for ex in examples:
        try:
            text = tasks_lib.apply_template(ex, template=template, tokenizer=tokenizer)
            length = len(prompt_ids(tokenizer, text))
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
