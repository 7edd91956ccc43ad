"""The field checks of a run config: each problem is one ConfigError line naming the field.

`Fields` checks the values of one config node (ints, numbers, choices, ...); `SectionCheck`
adds what a stage section's constraints depend on (the data-parallel size, the task, the
prompt bucket, the earlier stages) and is what each stage kind's `validate(check)` receives.
Nothing here builds a task, a tokenizer or a model: `runner.tokenizers`, `runner.model_init`
and `runner.inputs` do, and `runner.validation.validate` runs both in order.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from grpo_jax import parallel, storage
from grpo_jax.runner import rewards as rewards_lib

TEMPLATES = ("plain", "r1_zero", "chat")
# The smallest sampling temperature a section may set. The sampler and the loss divide the
# float32 logits by it: below ~1e-36 that overflows to inf for ordinary logits (1e-45, a
# float32 denormal, gives inf / NaN probabilities). Far above that floor nothing is lost:
# 1e-4 practically samples the argmax already. There is no temperature 0 (greedy): the
# sampler's greedy setting is not a section field.
MIN_TEMPERATURE = 1e-4


class ConfigError(ValueError):
    """A config field has a value the run cannot use (the message names the field)."""


def stage_names(config) -> list[str]:
    return [s.strip() for s in str(config.stages).split(",") if s.strip()]


def extendable_stage(config) -> int | None:
    """The index of the stage a finished run can continue ("train longer" by raising its
    `steps`): the last stage that is not an eval, when it has `steps` (only evals follow
    it; they run again after the extension). None when there is none."""
    names = stage_names(config)
    for index in range(len(names) - 1, -1, -1):
        section = config[names[index]]
        if section.get("kind") != "eval":
            return index if "steps" in section else None
    return None


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

    def temperature(self, field: str = "temperature") -> float:
        """A sampling temperature: a finite number >= MIN_TEMPERATURE."""
        value = self.number(field)
        if value < MIN_TEMPERATURE:
            self.fail(field, f"expected a temperature >= {MIN_TEMPERATURE:g} (below it "
                             "logits / temperature overflows float32; greedy decoding is not "
                             f"a temperature setting), got {value!r}")
        return value

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
            if rewards_lib.is_python_reward(reward):
                try:
                    rewards_lib.load_python_reward(reward)
                except ValueError as err:
                    self.fail(f"{field}.{reward}", str(err))
            elif reward not in known:
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


def output_dir_problem(path: str) -> str | None:
    """Why `path` cannot be a directory this process writes into (created when missing), in
    a few words naming the path at fault; None when it can. A missing directory is created
    and removed again to ask the OS (nothing is left behind). A file:// URL is checked as its
    local path; object-store URLs (`gs://...`) are left to the storage library. An empty
    path is refused (it would be the current folder)."""
    if not str(path).strip():
        return f"{path!r} is empty (it would be the current folder)"
    if storage.is_url(path):
        try:
            path = storage.local_path(path)
        except ValueError as err:
            return str(err)
        if path is None:
            return None
    path = os.path.abspath(path)
    if os.path.lexists(path) and not os.path.exists(path):
        return f"{path!r} is a broken symbolic link"
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path!r} exists and is not a directory"
    existing = path
    while not os.path.exists(existing):  # the nearest ancestor there is: created below it
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, so {path!r} cannot be created"
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "" if existing == path else f", so {path!r} cannot be created"
        return f"{existing!r} is not writable by this user{what}"
    if existing != path:  # the OS may still refuse (/proc, a read-only mount the bits do not
        try:              # show): create it, then remove what was created
            os.makedirs(path)
        except OSError as err:
            return f"{path!r} cannot be created: {err.strerror or err}"
        while path != existing:
            try:
                os.rmdir(path)
            except OSError:
                break
            path = os.path.dirname(path)
    return None


def workdir_problem(path: str) -> str | None:
    """`output_dir_problem` of a run's workdir, which must also be somewhere orbax writes
    checkpoints: a local path, or a gs:// or file:// URL."""
    from grpo_jax.checkpoint import URL_SCHEMES  # pylint: disable=import-outside-toplevel

    if storage.is_url(path) and storage.scheme(path) not in URL_SCHEMES:
        return (f"{path!r} is on a store orbax cannot write checkpoints to (it writes local "
                "paths, gs:// and file:// URLs)")
    return output_dir_problem(path)


def check_section_fields(check: SectionCheck, default) -> None:
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
    count = mesh.integer("num_devices", low=0, high=jax.device_count()) or jax.device_count()
    rollout = 0
    if config.mesh.get("rollout_devices") is not None:
        rollout = mesh.integer("rollout_devices", low=0, high=count - 1)
        if rollout and jax.process_count() > 1:
            mesh.fail("rollout_devices", f"splits the devices of one process only (this run "
                                         f"has {jax.process_count()}); set it to 0")
    try:
        shape = parallel.resolve_mesh_shape(config.mesh.shape.to_dict(), count - rollout)
    except ValueError as err:
        raise ConfigError(f"mesh.shape: {err}") from None
    return shape, shape["data"] * shape["fsdp"]


def _rule_axes(axes):
    """Config rule value -> mesh axes: "" or None = replicated, "a,b" = several axes."""
    if axes is None or axes == "":
        return None
    if isinstance(axes, str) and "," in axes:
        return tuple(a.strip() for a in axes.split(","))
    return tuple(axes) if isinstance(axes, (list, tuple)) else axes


def mesh_rules(config) -> tuple:
    """config.mesh.rules as (logical name, mesh axes) pairs."""
    return tuple((name, _rule_axes(axes)) for name, axes in config.mesh.rules)
