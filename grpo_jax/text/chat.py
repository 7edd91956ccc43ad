"""Chat templates: a checkpoint's Jinja chat template rendered offline with jinja2.

Instruct checkpoints ship their prompt format as a Jinja template, either in
tokenizer_config.json (`chat_template`: a string, or a list of {"name", "template"} entries
of which "default" is used) or in a separate `chat_template.jinja` file (newer exports).
The template is rendered in jinja2's immutable sandbox with the conventions the
Hugging Face templates are written for: `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, a `tojson` filter that keeps non-ASCII characters, and the
globals `raise_exception(message)` and `strftime_now(format)`.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["BUILTIN_TEMPLATES", "ChatTemplated", "ChatTemplateError", "chat_template_source",
           "load_chat_template", "render_chat", "tool_response_renderer"]

CHAT_TEMPLATE_FILE = "chat_template.jinja"

# A chat template for the miniature jobs' own tokenizers (task.chat_template=miniature), in
# the Hermes / Qwen2.5 convention at a tiny model's length: the tools listed by name and
# parameter before the conversation, the user's turn as it is, the assistant's calls in
# <tool_call> tags, each tool's answer in <tool_response> tags right after the call.
MINIATURE = (
    "{%- if tools %}{{ '<tools>' }}{% for tool in tools %}{{ ' ' if not loop.first }}"
    "{{ tool.function.name }}({{ tool.function.parameters.required | join(',') }})"
    "{% endfor %}{{ '</tools>\\n' }}{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}{{ '<tool_response>' + message.content + "
    "'</tool_response>' }}"
    "{%- elif message.role == 'user' %}{{ message.content + '\\n' }}"
    "{%- else %}{{ message.content }}{% endif %}"
    "{%- endfor %}")
BUILTIN_TEMPLATES = {"miniature": MINIATURE}


class ChatTemplateError(ValueError):
    """A chat template is missing, malformed, or raised while rendering."""


def load_chat_template(directory: str | Path, settings: Mapping | None = None) -> str | None:
    """The chat template of a checkpoint directory, or None when it has none.

    Args:
      directory: the checkpoint (or tokenizer) directory.
      settings: its tokenizer_config.json, when already read.

    Returns:
      the template source: `chat_template.jinja` when present, else tokenizer_config.json's
      `chat_template` (its "default" entry when it is a list of named templates).
    """
    directory = Path(directory)
    file = directory / CHAT_TEMPLATE_FILE
    if file.is_file():
        return file.read_text(encoding="utf-8")
    if settings is None:
        config_file = directory / "tokenizer_config.json"
        settings = json.loads(config_file.read_text()) if config_file.is_file() else {}
    template = settings.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template
                 if isinstance(entry, Mapping)}
        if "default" not in named:
            raise ChatTemplateError(f"{directory}/tokenizer_config.json: chat_template lists "
                                    f"{sorted(map(str, named))} but no 'default' template")
        template = named["default"]
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"{directory}/tokenizer_config.json: chat_template must be "
                                f"a string, got {type(template).__name__}")
    return template


def chat_template_source(name: str) -> str:
    """The Jinja source `task.chat_template` names: a built-in template (`BUILTIN_TEMPLATES`)
    or a .jinja file."""
    if name in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name]
    path = Path(name).expanduser()
    if not path.is_file():
        raise ChatTemplateError(f"task.chat_template: {name!r} is neither a built-in template "
                                f"({', '.join(sorted(BUILTIN_TEMPLATES))}) nor a Jinja file")
    return path.read_text(encoding="utf-8")


class ChatTemplated:
    """A tokenizer's chat template (`chat_template`: the Jinja source, or None) and what is
    rendered with it; the tokenizer provides `id_to_token` and its special ids."""

    chat_template: str | None = None

    def _no_template(self) -> str:
        return (f"{type(self).__name__}: no chat template (set task.chat_template, e.g. "
                "'miniature'); use task.template=r1_zero or plain")

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = True,
                            tools=None) -> str:
        """The chat template rendered for `messages` (text, not ids), with `tools`
        (JSON-schema function specs) described where the template puts them.

        Raises:
          ChatTemplateError: the tokenizer has no chat template.
        """
        if self.chat_template is None:
            raise ChatTemplateError(self._no_template())
        return render_chat(self.chat_template, messages,
                           add_generation_prompt=add_generation_prompt, tools=tools,
                           **self._special_tokens())

    def tool_response_renderer(self):
        """observation -> the text of a tool's answer in the template's chat format
        (`tool_response_renderer`), or None without a template or a tool role."""
        if self.chat_template is None:
            return None
        return tool_response_renderer(self.chat_template, **self._special_tokens())

    def _special_tokens(self) -> dict:
        specials = {"bos_token": self.bos_id, "eos_token": self.eos_id,
                    "pad_token": self.pad_id}
        return {name: self.id_to_token(i) if i >= 0 else None for name, i in specials.items()}


def _raise(message):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


_COMPILED: dict[str, object] = {}


def _compile(source: str):
    if source not in _COMPILED:
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as error:  # pragma: no cover - jinja2 is a core dependency
            raise ImportError("chat templates need the `jinja2` package") from error
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            _COMPILED[source] = env.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"chat template: line {error.lineno}: {error.message}") \
                from None
    return _COMPILED[source]


def render_chat(template: str, messages: Sequence[Mapping[str, str]], *,
                add_generation_prompt: bool = True, tools: Sequence[Mapping] | None = None,
                **special_tokens: str | None) -> str:
    """Renders `messages` ([{"role": "user", "content": ...}, ...]) with a chat template.

    Args:
      template: the Jinja source (`load_chat_template`).
      messages: the conversation so far.
      add_generation_prompt: end with the header of the assistant's turn, so that the
        model's continuation is its answer.
      tools: the tools described to the model (JSON-schema function specs,
        `tools.calls.schema`), as the template's `tools` variable; None: none.
      **special_tokens: bos_token, eos_token, ... as strings (the templates use them).

    Returns:
      the prompt text (special tokens spelled out; the tokenizer maps them to their ids).
    """
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not {"role", "content"} <= set(message):
            raise ChatTemplateError(f"messages[{index}]: expected a mapping with 'role' and "
                                    f"'content', got {message!r:.80}")
    import jinja2

    compiled = _compile(template)
    try:
        return compiled.render(messages=list(messages),
                               add_generation_prompt=add_generation_prompt,
                               **({"tools": list(tools)} if tools else {}),
                               **{k: v for k, v in special_tokens.items() if v is not None})
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"chat template: {type(error).__name__}: {error}") from None


def tool_response_renderer(template: str, **special_tokens: str | None):
    """How a chat template writes a tool's answer in the middle of the assistant's turn, or
    None when it has no tool role.

    The text after the assistant's call is what the template renders after an assistant
    message and a "tool" message, up to and including the next assistant header: e.g. for
    Qwen2's template "<|im_end|>\n<|im_start|>user\n<tool_response>\n{observation}\n
    </tool_response><|im_end|>\n<|im_start|>assistant\n". A template that raises on the
    role, drops the message, or writes it anywhere but after the assistant's text has none.

    Returns:
      observation text -> the text appended to the context, or None.
    """
    said, observed = "\x01assistant\x01", "\x01tool\x01"
    messages = [{"role": "user", "content": "question"},
                {"role": "assistant", "content": said}, {"role": "tool", "content": observed}]
    try:
        rendered = render_chat(template, messages, add_generation_prompt=True,
                               **special_tokens)
    except ChatTemplateError:
        return None
    if rendered.count(said) != 1 or rendered.count(observed) != 1 \
            or rendered.index(said) > rendered.index(observed):
        return None
    before, after = rendered[rendered.index(said) + len(said):].split(observed)
    return lambda observation: before + observation + after
