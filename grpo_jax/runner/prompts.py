"""A run's prompts: the template of its config, with a chat template's user turn and the
JSON tools its stages call described to the model (`prompt_of`)."""

from __future__ import annotations

from grpo_jax import tasks as tasks_lib
from grpo_jax.tools import JSON_PREFIX, make_environment

__all__ = ["prompt_of", "run_tool_schemas"]


def prompt_of(config, task, tokenizer, example, tools=None) -> str:
    """The example's prompt in the config's template, rendered with `tokenizer` for "chat"
    with the task's user turn (`Task.chat_user`) and `tools` described to the model: by
    default the JSON tools of the run's stages (`run_tool_schemas`), so that every stage's
    prompts (pretraining traces, SFT, RL, evaluation) describe the same tools."""
    if tools is None and config.task.template == tasks_lib.templates.CHAT:
        tools = run_tool_schemas(config)
    return tasks_lib.apply_template(example, template=config.task.template,
                                    tokenizer=tokenizer, tools=tools,
                                    user=getattr(task, "chat_user", None))


def run_tool_schemas(config) -> list[dict] | None:
    """The tools a run describes to its model: those of the first stage whose `tools` calls
    them as JSON ("json:..."), or None."""
    for name in config.stages.split(","):
        name = name.strip()
        tools = config[name].get("tools", "") if name in config else ""
        if isinstance(tools, str) and tools.startswith(JSON_PREFIX):
            return make_environment(tools).schemas
    return None
