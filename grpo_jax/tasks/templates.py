"""Prompt templates and the completion layout.

"r1_zero" follows the structure of the DeepSeek-R1-Zero template (https://arxiv.org/abs/2501.12948,
table 1), reworded: the User asks, the Assistant reasons inside <think> </think> and answers
inside <answer> </answer>; the prompt ends with "Assistant:". "plain" is short, for tiny
character-level models. "chat" puts the question and the same layout instruction in one user
message and renders it with the tokenizer's own chat template (a checkpoint's tokenizer),
ending with the assistant's header, so instruct models are prompted in their own format.
Any other string containing "{question}" is used as a template.
"""

from __future__ import annotations

R1_ZERO = (
    "A conversation between User and Assistant. The User asks a question and the Assistant "
    "solves it. The Assistant first works through the reasoning and then gives the User the "
    "answer. The reasoning goes inside <think> </think> tags and the answer inside "
    "<answer> </answer> tags, that is, <think> reasoning here </think> <answer> answer here "
    "</answer>.\nUser: {question}\nAssistant:"
)
PLAIN = "Q: {question}\nA: "

# The user message of the "chat" template.
CHAT_USER = (
    "{question}\nReason step by step inside <think> </think> tags, then give only the final "
    "answer inside <answer> </answer> tags."
)
CHAT = "chat"

TEMPLATES: dict[str, str] = {"r1_zero": R1_ZERO, "plain": PLAIN, CHAT: CHAT_USER}


def get_template(template: str) -> str:
    """The template text for a name, or `template` itself if it contains "{question}".

    Raises:
      ValueError: unknown name that is not itself a template.
    """
    if template in TEMPLATES:
        return TEMPLATES[template]
    if isinstance(template, str) and "{question}" in template:
        return template
    raise ValueError(f"template: unknown {template!r}; expected one of {sorted(TEMPLATES)} or a "
                     "string containing '{question}'")


def apply_template(example_or_question, template: str = "r1_zero", tokenizer=None,
                   tools=None, user: str | None = None) -> str:
    """The prompt string for a question under a template.

    Args:
      example_or_question: an Example (its `prompt` field is the question) or the question text.
      template: "r1_zero", "plain", "chat", or a custom string with "{question}".
      tokenizer: for "chat": a tokenizer with `apply_chat_template` (text.HFTokenizer).
      tools: for "chat": the tools described to the model (the template's `tools=`).
      user: for "chat": the user turn's text with "{question}" (default: the question and
        the think / answer instruction; a task's `chat_user` replaces it).

    Returns:
      the prompt (the question substituted verbatim; braces in it are left alone).
    """
    question = getattr(example_or_question, "prompt", example_or_question)
    if not isinstance(question, str):
        raise ValueError(f"apply_template: question must be a str, got {type(question).__name__}")
    text = (user if template == CHAT and user else get_template(template)).replace(
        "{question}", question)
    if template != CHAT:
        return text
    if getattr(tokenizer, "apply_chat_template", None) is None:
        raise ValueError("template: 'chat' renders the checkpoint's chat template and needs "
                         "its tokenizer (tokenizer=checkpoint)")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True,
                                         **({"tools": tools} if tools else {}))


def format_completion(thinking: str, answer: str, template: str = "r1_zero") -> str:
    """The completion layout rewarded by the format rewards.

    Returns "<think>{thinking}</think><answer>{answer}</answer>" (the same for every template;
    `template` is validated and kept for the contract).
    """
    get_template(template)
    return f"<think>{thinking}</think><answer>{answer}</answer>"
