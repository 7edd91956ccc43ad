"""A study's configs: the jobs' builders (imported when a config is built, so `list` stays
light), the tier's preset and sizes, and the hash that keys a run by what it computes."""

from __future__ import annotations

import hashlib
import json

# Fields that do not change what a run computes (left out of its hash).
VOLATILE_FIELDS = ("compilation_cache_dir", "loggers", "report_plots", "sandbox")

# Fields added to the configs after the full tier's runs were made, each with the value that
# keeps a run what it was: `config_hash` leaves a field out while it holds that value, so a
# new option does not orphan every finished run (each study's design block lists its configs'
# keys, and its test fails when one changes). "KIND.FIELD" names a field of every stage
# section of that kind (e.g. "rl.some_option"); any other key is a dotted path from the top.
NEUTRAL_DEFAULTS: dict[str, object] = {
    "rl.advantage_sign": "both",  # the policy gradient on every token, whatever its sign
    "pretrain.solution_fraction": 1.0,  # every pretraining row a worked solution
}


def main_job(preset: str | None = None):
    """`config_presets.main_job`, imported when a config is built (so `list` stays light)."""
    from grpo_jax import config_presets

    return config_presets.main_job(preset)


def agents_job(preset: str | None = None):
    """`config_presets.agents_job`, imported when a config is built."""
    from grpo_jax import config_presets

    return config_presets.agents_job(preset)


def tool_job(preset: str | None = None):
    """`config_presets.tool_job`, imported when a config is built."""
    from grpo_jax import config_presets

    return config_presets.tool_job(preset)


def main_base(tier: str):
    """The main job's pretraining as a base (1500 steps; the smoke preset's 3 at the mini
    tier): the base most studies share."""
    config = main_job(preset(tier))
    config.stages = "pretrain"
    return config


def main_arm(tier: str, stages: str):
    """The main job as an arm from a base: no pretraining, `stages`, and model.init_from
    left for the study to set per base."""
    config = main_job(preset(tier))
    del config.pretrain
    config.model.init_from = ""  # the base's workdir, set by the study per base
    config.stages = stages
    return config


def preset(tier: str) -> str | None:
    """The config preset of a tier: the smoke sizes at the mini tier, the job's own at full."""
    return "smoke" if tier == "mini" else None


def config_hash(config) -> str:
    """The sha256 of a resolved config's canonical JSON (fields that only say where caches
    live left out): equal for configs that compute the same run, and only for those."""
    data = json.loads(config.to_json_best_effort(sort_keys=True))
    for field in VOLATILE_FIELDS:
        data.pop(field, None)
    _drop_neutral(data, NEUTRAL_DEFAULTS)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _drop_neutral(data: dict, neutral: dict) -> None:
    """Removes from `data` (a config as JSON) each field of `neutral` that holds its listed
    value: "KIND.FIELD" in every stage section of that kind, a dotted path otherwise."""
    for key, value in neutral.items():
        head, _, field = key.partition(".")
        sections = [s for s in data.values() if isinstance(s, dict) and s.get("kind") == head]
        if field and "." not in field and sections:
            for section in sections:
                if field in section and section[field] == value:
                    del section[field]
            continue
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == value:
            del node[leaf]


def config_key(config) -> str:
    """The first 10 hex digits of `config_hash`: what the design blocks list."""
    return config_hash(config)[:10]


def for_tier(config, tier: str):
    """A study's config as its tier runs it: the mini tier on one device, as the CPU job runs
    (the test suite's 8 virtual CPU devices would otherwise shard the toy runs), with no
    tracker and no PNG in its runs' reports (the study draws its own figures; both are
    VOLATILE_FIELDS, so its runs keep their keys)."""
    if tier == "mini":
        if "mesh" in config:
            config.mesh.num_devices = 1
        if "loggers" in config:
            config.loggers = ""
        if "report_plots" in config:
            config.report_plots = False
    return config


def for_tier_base(config, tier: str):
    """A base's config as its tier builds it: `for_tier`, and at the mini tier the jobs'
    tiny-1m model with one block (the arms take the base's shape), at a fraction of the
    compile (a base of another named size, e.g. a distillation student that a stage names,
    keeps its shape)."""
    config = for_tier(config, tier)
    if tier == "mini" and "model" in config and not config.model.get("init_from") \
            and config.model.name == "tiny-1m":
        config.model.num_layers = 1
    return config
