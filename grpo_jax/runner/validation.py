"""Start-up validation of a run config: each problem is one line naming the field.

`validate(config, kinds)` runs before the workdir is touched and before any stage: the
run-wide fields (stages, task, tokenizer, model, mesh, optim, checkpoint), then the run's
inputs are built once (`inputs.build_inputs`: task, model.init_from's config, tokenizer,
prompt bucket), then every stage named in `config.stages` is checked against them (its
fields against its kind's default section, then the kind's own `validate(check)`). It
returns the inputs, which the `Run` uses as they are. A tokenizer trained in the workdir is
built by the Run, which then checks the stages again with its prompt bucket
(`check_stages`).
"""

from __future__ import annotations

import os

import ml_collections

from grpo_jax import parallel
from grpo_jax import tasks as tasks_lib
from grpo_jax import trackers
from grpo_jax.models import lora
from grpo_jax.models.config import _DTYPES, ATTENTION_IMPLEMENTATIONS, available_models
from grpo_jax.runner.inputs import RunInputs, build_inputs
from grpo_jax.runner.model_init import (EXECUTION_FIELDS, MODEL_SHAPE_FIELDS, check_init_from,
                                        lora_targets, model_config_for)
from grpo_jax.runner.tokenizers import TOKENIZERS, tokenizer_kind
from grpo_jax.text.chat import BUILTIN_TEMPLATES, ChatTemplateError, chat_template_source
from grpo_jax.tools import sandbox
from grpo_jax.runner.checks import (TEMPLATES, ConfigError, Fields, SectionCheck,
                                    check_section_fields, mesh_rules, mesh_size, stage_names)

__all__ = ["ConfigError", "check_run_fields", "check_stages", "validate"]


def uses_sandbox(config) -> bool:
    """Whether the run executes policy code: the code task's tests or a python tool."""
    if config.task.get("name") == "code_expression":
        return True
    for name in str(config.get("stages", "")).split(","):
        section = config.get(name.strip())
        tools = section.get("tools", "") if isinstance(section, ml_collections.ConfigDict) else ""
        if isinstance(tools, str) and "python" in tools:
            return True
    return False


def check_sandbox(config) -> None:
    """sandbox.isolation is known, and a run that executes policy code can start its sandbox
    here (bubblewrap installed, namespaces allowed): else one line saying how to fix it."""
    isolation = "bwrap"
    if "sandbox" in config:
        isolation = Fields(config.sandbox, "sandbox").choice("isolation", sandbox.ISOLATIONS)
    if uses_sandbox(config):
        try:
            sandbox.check_isolation(isolation)
        except sandbox.SandboxUnavailable as err:
            raise ConfigError(str(err)) from None


def validate(config: ml_collections.ConfigDict, kinds) -> RunInputs:
    """Raises ConfigError with one line for the first invalid field of a run config.

    Args:
      config: the run config.
      kinds: the stage-kind registry.

    Returns:
      the run's inputs (task, tokenizer, prompt bucket, model.init_from's model config),
      each built once; the tokenizer and the bucket are None when the tokenizer is trained
      in the workdir.
    """
    check_run_fields(config, kinds)
    inputs = build_inputs(config)
    check_stages(config, kinds, inputs)
    return inputs


def check_run_fields(config: ml_collections.ConfigDict, kinds) -> None:
    """The stage list and the run-wide sections; builds nothing."""
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
    if "report_plots" in config:
        top.boolean("report_plots")
    if "rl_samples_logged" in config:  # optional: RL completions written to samples.jsonl
        if top.integer("rl_samples_logged", low=-1) == 0:
            top.fail("rl_samples_logged", "expected -1 (every completion of every step) or a "
                                          "positive count, got 0")
    if "loggers" in config:
        check_loggers(config.loggers)
    if "math_verify" in config:
        verify = Fields(config.math_verify, "math_verify")
        verify.positive("deadline_seconds")
        verify.integer("workers", high=64)  # each a process holding math-verify (~100 MB)
    check_sandbox(config)
    if "python_rewards" in config:
        Fields(config.python_rewards, "python_rewards").positive("budget_seconds")

    task = Fields(config.task, "task")
    task.choice("name", tasks_lib.available_tasks())
    task.choice("template", TEMPLATES)
    if task.integer("prompt_len", low=0) == 1:
        task.fail("prompt_len", "expected 0 (auto: the longest prompt, measured at start-up) "
                                "or >= 2, got 1")
    task.integer("train_size")
    task.integer("eval_size")
    if "train_seed" in config.task:  # optional: the training problems' seed
        task.integer("train_seed", low=0)
    if "train_pick" in config.task:  # optional: positions among the train_size problems
        pick, size = config.task.train_pick, config.task.train_size
        if (not isinstance(pick, (tuple, list)) or not pick or len(set(pick)) != len(pick)
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size
                           for i in pick)):
            task.fail("train_pick", f"expected distinct indices in [0, train_size = {size}), "
                                    f"got {pick!r}")
    if "eval_seed" in config.task:
        task.integer("eval_seed", low=0)
    task.number("solution_error_rate", low=0.0, high=1.0)
    task.number("format_error_rate", low=0.0, high=1.0)

    top.choice("tokenizer", TOKENIZERS)
    top.integer("tokenizer_vocab_size", low=8)
    check_model_fields(config)
    check_tokenizer_fields(config)
    mesh_size(config)
    try:
        parallel.validate_rules(mesh_rules(config))
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


def check_loggers(value) -> tuple[str, ...]:
    """config.loggers: known tracker names whose packages are installed."""
    if not isinstance(value, (str, list, tuple)):
        raise ConfigError(f"loggers: expected a comma-separated string, got {value!r}")
    try:
        names = trackers.parse_loggers(value)
    except ValueError as err:
        raise ConfigError(f"loggers: {err}") from None
    for name in names:
        why_not = trackers.missing_package(name)
        if why_not is not None:
            raise ConfigError(f"loggers: {why_not}")
    return names


def check_model_fields(config) -> None:
    """config.model: a known name, dtypes, and a shape ModelConfig accepts (with
    model.init_from the shape is the checkpoint's: `model_init.checkpoint_config` reads it)."""
    model = Fields(config.model, "model")
    model.string("name")
    if not config.model.init_from:
        model.choice("name", available_models())
    model.choice("dtype", _DTYPES)
    model.choice("param_dtype", _DTYPES)
    if config.model.get("attention") is not None:
        model.choice("attention", ATTENTION_IMPLEMENTATIONS)
    model.integer("max_seq_len", low=2)
    model.integer("logprob_chunk_size", low=0)
    model.integer("logprob_chunk_rows", low=0)
    model.integer("batch_streams", low=0)
    check_lora_fields(config)
    if config.model.init_from:
        for field in MODEL_SHAPE_FIELDS:
            if field not in EXECUTION_FIELDS and config.model.get(field) is not None:
                model.fail(field, "the shape comes from model.init_from's config.json; only "
                                  f"{', '.join('model.' + f for f in EXECUTION_FIELDS)} "
                                  "may be set with it")
        for field in ("remat", "scan_layers"):
            if config.model.get(field) is not None:
                model.boolean(field)
        return
    for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "mlp_size"):
        if config.model.get(field) is not None:
            model.integer(field)
    for field in ("rope_theta", "rms_norm_eps"):
        if config.model.get(field) is not None:
            model.positive(field)
    try:
        shape = model_config_for(config, 256)  # the shape's own constraints (heads divide, ...)
    except ValueError as err:
        message = str(err)
        for field in MODEL_SHAPE_FIELDS + ("max_seq_len", "dtype", "param_dtype"):
            if message.startswith(f"ModelConfig.{field}"):
                raise ConfigError("model." + message[len("ModelConfig."):]) from None
        raise ConfigError(f"model: {message}") from None
    weights = shape.num_params() * shape.parameter_dtype.itemsize
    memory, where = device_memory()
    if weights > memory:  # a typo in a size (hidden_size=409600): it could never be placed
        raise ConfigError(f"model: {shape.num_params():,} parameters x "
                          f"{shape.parameter_dtype.itemsize} bytes ({weights / 1e9:,.1f} GB) "
                          f"exceed {where} ({memory / 1e9:,.1f} GB); expected smaller "
                          "model.hidden_size / num_layers / mlp_size / num_heads / head_dim")
    rank = config.model.get("lora_rank", 0)
    if rank and rank > shape.hidden_size:  # a rank past the width adds nothing but memory
        model.fail("lora_rank", f"expected <= the model's hidden_size {shape.hidden_size} "
                                f"(a low-rank update), got {rank}")


def device_memory() -> tuple[int, str]:
    """(bytes, what they are) that a run's arrays can occupy at most: the memory of every
    device of the run (as each reports it), or the host's physical memory where the
    devices report none (CPU devices share it)."""
    import jax

    limits = []
    for device in jax.local_devices():
        try:
            limits.append(int((device.memory_stats() or {}).get("bytes_limit") or 0))
        except Exception:  # noqa: BLE001  a backend without memory statistics
            limits.append(0)
    if limits and all(limits):
        count = len(limits) * jax.process_count()
        return sum(limits) * jax.process_count(), f"the memory of the run's {count} devices"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host * jax.process_count(), "the host's memory"


def check_lora_fields(config) -> None:
    """model.lora_rank (0 = off), lora_alpha and lora_targets, when the config has them."""
    if "lora_rank" not in config.model:
        return
    model = Fields(config.model, "model")
    model.integer("lora_rank", low=0)
    model.positive("lora_alpha")
    value = model.value("lora_targets")
    if not isinstance(value, (str, tuple, list)) or \
            not all(isinstance(item, str) for item in ([value] if isinstance(value, str)
                                                       else value)):
        model.fail("lora_targets", f"expected kernel names, got {value!r}")
    targets = lora_targets(config)
    unknown = [name for name in targets if name not in lora.TARGETS]
    if unknown or not targets:
        model.fail("lora_targets", f"expected kernel names out of {list(lora.TARGETS)}, got "
                                   f"{unknown or list(targets)}")
    if len(set(targets)) < len(targets):
        model.fail("lora_targets", f"a kernel is named twice: {list(targets)}")


def check_tokenizer_fields(config) -> None:
    """The tokenizer the config names can exist: a checkpoint tokenizer needs
    model.init_from with its tokenizer.json, the chat template a checkpoint tokenizer."""
    if config.model.init_from:
        check_init_from(config.model.init_from)  # before its files are read for the kind
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
    own = config.task.get("chat_template", "")
    if not isinstance(own, str):
        raise ConfigError(f"task.chat_template: expected a string (a built-in template: "
                          f"{sorted(BUILTIN_TEMPLATES)}, or a Jinja file), got {own!r}")
    if own:
        try:
            chat_template_source(own)
        except ChatTemplateError as err:
            raise ConfigError(str(err)) from None
    if config.task.template == "chat" and kind != "checkpoint" and not own:
        raise ConfigError(f"task.template: 'chat' renders a chat template: the checkpoint's "
                          f"(tokenizer=checkpoint) or task.chat_template's (e.g. 'miniature' "
                          f"for a {kind} tokenizer), got tokenizer {kind!r} and no "
                          "task.chat_template")


def check_stages(config: ml_collections.ConfigDict, kinds, inputs: RunInputs) -> None:
    """Every stage of config.stages: its fields against its kind's default section, its
    field groups' checks, then the kind's own `validate(check)` with the run's inputs."""
    _, data_parallel = mesh_size(config)
    earlier = []
    for name in stage_names(config):
        section = config[name]
        kind = kinds[section.kind]
        check = SectionCheck(name, section, config=config, data_parallel=data_parallel,
                             task=inputs.task, kinds=kinds, earlier=list(earlier),
                             prompt_len=inputs.prompt_len, tokenizer=inputs.tokenizer)
        check_section_fields(check, kind.default_section())
        if config.model.get("lora_rank", 0) and not kind.lora:
            supported = sorted(n for n in kinds if kinds[n].lora)
            check.fail("kind", f"LoRA (model.lora_rank {config.model.lora_rank}) is not "
                               f"supported for stage kind {section.kind!r}; kinds with LoRA: "
                               f"{supported}")
        if "temperature" in section:  # every kind that samples at a set temperature
            check.temperature("temperature")
        for group in kind.groups:  # the shared field groups, then the kind's own fields
            group.check(check)
        if kind.validate is not None:
            kind.validate(check)
        earlier.append((name, section.kind))
