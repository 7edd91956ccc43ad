"""Start-up validation of a run config: each problem is one line naming the field."""

from __future__ import annotations

import jax
import ml_collections


class ConfigError(ValueError):
    """A config field has a value the run cannot use (message names the field)."""


_LOSS_AGG = ("auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
             "seq-mean-token-sum-norm")


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises ConfigError with one line for the first invalid field."""
    from grpo_jax import tasks as tasks_lib
    from grpo_jax.pipeline import STAGE_KINDS
    from grpo_jax import stages  # noqa: F401  (registers the stage kinds)
    from grpo_jax.rl.algorithms import ALGORITHMS

    stage_names = [s.strip() for s in str(config.stages).split(",") if s.strip()]
    _require(bool(stage_names), "stages: expected a comma-separated list of section names")
    for name in stage_names:
        _require(name in config, f"stages: {name!r} has no config section config.{name}")
        section = config[name]
        _require("kind" in section and section.kind in STAGE_KINDS,
                 f"{name}.kind: expected one of {sorted(STAGE_KINDS)}, got "
                 f"{section.get('kind')!r}")
    _require(config.task.name in tasks_lib.available_tasks(),
             f"task.name: unknown task {config.task.name!r}; available: "
             f"{sorted(tasks_lib.available_tasks())}")
    _require(config.task.template in ("plain", "r1_zero"),
             f"task.template: expected plain or r1_zero, got {config.task.template!r}")
    _require(config.task.prompt_len >= 2, "task.prompt_len: expected >= 2")
    _require(config.tokenizer in ("char", "sentencepiece"),
             f"tokenizer: expected char or sentencepiece, got {config.tokenizer!r}")
    from grpo_jax.parallel import resolve_mesh_shape

    try:
        count = config.mesh.get("num_devices", 0)
        _require(0 <= count <= jax.device_count(),
                 f"mesh.num_devices: expected 0..{jax.device_count()}, got {count}")
        mesh = resolve_mesh_shape(config.mesh.shape.to_dict(), count or jax.device_count())
    except ValueError as err:
        raise ConfigError(str(err)) from None
    num_devices = mesh["data"] * mesh["fsdp"]  # the batch is split over data x fsdp
    from grpo_jax import extra_stages

    for name in stage_names:
        section = config[name]
        try:
            extra_stages.validate(name, section, config)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if section.kind in ("pretrain", "sft"):
            _require(section.steps >= 1, f"{name}.steps: expected >= 1, got {section.steps}")
            _require(section.batch_size % (section.micro_batches * num_devices) == 0,
                     f"{name}.batch_size: {section.batch_size} is not divisible by "
                     f"micro_batches x data-parallel devices = {section.micro_batches} x {num_devices}")
        if section.kind == "eval":
            _require(section.num_samples >= 1, f"{name}.num_samples: expected >= 1")
            _require(section.batch_size % num_devices == 0,
                     f"{name}.batch_size: {section.batch_size} is not divisible by the "
                     f"{num_devices} data-parallel devices")
            _require(config.task.prompt_len + config.rl.max_new_tokens <= config.model.max_seq_len,
                     f"rl.max_new_tokens: prompt_len {config.task.prompt_len} + "
                     f"max_new_tokens {config.rl.max_new_tokens} exceeds model.max_seq_len "
                     f"{config.model.max_seq_len}")
        if section.kind == "rl":
            _require(section.algorithm in ALGORITHMS,
                     f"{name}.algorithm: unknown algorithm {section.algorithm!r}; expected "
                     f"one of {sorted(ALGORITHMS)}")
            algorithm = ALGORITHMS[section.algorithm]
            g = section.group_size
            _require(g >= 1, f"{name}.group_size: expected >= 1, got {g}")
            if algorithm.needs_groups:
                _require(g >= 2, f"{name}.group_size: {section.algorithm} needs G >= 2 "
                                 f"completions per prompt, got {g}")
            rows = section.num_prompts * g
            _require(section.num_prompts >= 1, f"{name}.num_prompts: expected >= 1")
            _require(rows % section.num_minibatches == 0,
                     f"{name}.num_minibatches: rollout batch N*G = {rows} is not divisible by "
                     f"{section.num_minibatches}")
            per_mb = rows // section.num_minibatches
            _require(per_mb % (section.micro_batches * num_devices) == 0,
                     f"{name}.micro_batches: minibatch of {per_mb} rows is not divisible by "
                     f"micro_batches x data-parallel devices = {section.micro_batches} x {num_devices}")
            _require(section.loss_agg in _LOSS_AGG,
                     f"{name}.loss_agg: unknown loss aggregation {section.loss_agg!r}; expected "
                     f"one of {list(_LOSS_AGG)}")
            _require(section.kl_kind in ("k1", "k2", "k3"),
                     f"{name}.kl_kind: expected k1, k2 or k3, got {section.kl_kind!r}")
            _require(section.ratio_level in ("token", "sequence"),
                     f"{name}.ratio_level: expected token or sequence, got {section.ratio_level!r}")
            _require(section.temperature > 0, f"{name}.temperature: expected > 0")
            _require(section.max_new_tokens >= 1, f"{name}.max_new_tokens: expected >= 1")
            _require(config.task.prompt_len + section.max_new_tokens <= config.model.max_seq_len,
                     f"{name}.max_new_tokens: prompt_len {config.task.prompt_len} + "
                     f"max_new_tokens {section.max_new_tokens} exceeds model.max_seq_len "
                     f"{config.model.max_seq_len}")
            _require(section.steps >= 1, f"{name}.steps: expected >= 1")
            for switch in ("dynamic_sampling", "overlong_filter"):
                _require(section.get(switch, "auto") in ("auto", "on", "off"),
                         f"{name}.{switch}: expected auto, on or off, got "
                         f"{section.get(switch)!r}")
            _require(section.get("max_sampling_rounds", 1) >= 1,
                     f"{name}.max_sampling_rounds: expected >= 1")
            _require(0 <= section.get("overlong_cache", 0) <= section.max_new_tokens,
                     f"{name}.overlong_cache: expected 0 <= L_cache <= max_new_tokens")
            _require(len(section.rewards) > 0, f"{name}.rewards: expected at least one reward")
