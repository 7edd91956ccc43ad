"""The config reference page: every field of a run config with its type, default, allowed
values and comment, generated from the code.

    python -m grpo_jax.config_reference > docs/config_reference.md

The run-wide fields are the main job's (`config_presets.main_job`); each stage kind's section
is its `default_section(kind)`, its shared fields from the field groups (`runner.fields`). A
field's text is the comment above or beside the line that sets it; its allowed values are what
validation checks, recorded while the checks run on the defaults (`runner.validation`, the
field groups' checks and each kind's `validate`); a bound that depends on another field is
given at that field's default. tests/test_user_walk.py fails when the page is not current.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import sys
import tokenize

import ml_collections

from grpo_jax import config_presets
from grpo_jax.runner import checks, fields, validation
from grpo_jax.runner.inputs import build_inputs
from grpo_jax.stages import KINDS

__all__ = ["field_comments", "main", "reference"]

COMMAND = "python -m grpo_jax.config_reference > docs/config_reference.md"

# Fields whose allowed values depend on what is installed or registered: said in words.
_IN_WORDS = {
    "task.name": "a registered task (`grpo_jax.tasks.available_tasks()`)",
    "mesh.num_devices": "int in [0, the devices there are]",
    "mesh.rollout_devices": "int >= 0, fewer than the devices used",
}
# Mappings documented as one field (names to values), not field by field.
_MAPPINGS = ("rewards", "mesh.shape", "task.kwargs")


def field_comments(function, prefix: str) -> dict[str, str]:
    """{dotted field: comment} for each `prefix.a.b = ...` line of `function`'s source: the
    full-line comments just above it and the comment at its end (a comment line indented
    past its `#` continues the previous one), and for a ConfigDict written as a
    {"key": value,  # comment} literal, each key's comment as `a.b.key`. A field set again
    without a comment (a preset's value) keeps the first one; a field without any, set on
    the line after a commented one, points to it ("see `a.b`"). "# ---- x ----" headings
    are left out."""
    source = inspect.getsource(function)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    comment_at = {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}
    comments: dict[str, str] = {}
    above: list[str] = []
    target, literal, run_head = None, None, None
    loop_names, loop_comment = [], ""  # `for field, kind in (("name", int), ...)`
    pattern = re.compile(rf"^\s*{re.escape(prefix)}\.([\w.]+)\s*=\s*(.*)$")

    def text_of(number: int) -> str:
        raw = comment_at.get(number, "")
        return "" if re.match(r"^#\s*-{3,}", raw) else raw.lstrip("#").strip()

    def add(field: str, text: str) -> None:
        if text:
            comments[field] = f"{comments[field]} {text}" if comments.get(field) else text

    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            above, run_head = [], None
            continue
        if stripped.startswith("#"):
            if re.match(r"^#\s{2,}\S", stripped) and target and not above:
                add(target, text_of(number))  # continues the comment of the line above
            else:
                above.append(text_of(number))
            continue
        if stripped.startswith("for ") or loop_names:
            if stripped.startswith("for "):
                loop_comment = " ".join(t for t in above if t)
            loop_names += re.findall(r'\("(\w+)",\s*\w+\)', line)
            indexed = re.match(rf"^\s*{re.escape(prefix)}\.([\w.]+)\[\w+\]\s*=", line)
            if indexed:
                for name in loop_names:
                    comments.setdefault(f"{indexed.group(1)}.{name}", loop_comment)
                loop_names = []
        match = pattern.match(line)
        if match:
            target = match.group(1)
            own = " ".join(t for t in [*above, text_of(number)] if t)
            if own and not comments.get(target):
                comments[target] = own
            elif not own and target not in comments and run_head:
                comments[target] = f"see `{run_head}`"
            if own:  # a block comment above may cover the fields set right after
                run_head = target if any(above) else None
            literal = target if "ConfigDict({" in match.group(2) and "})" not in line else None
        elif literal and number in comment_at:
            key = re.match(r'^\s*"(\w+)"\s*:', line)
            if key:
                comments.setdefault(f"{literal}.{key.group(1)}", text_of(number))
        if "})" in line:
            literal = None
        above = []
    return comments


class _Recorder:
    """While active, every check a `checks.Fields` / `checks.SectionCheck` runs is written
    down as the allowed values of `<prefix>.<field>` (the outermost check of a field wins:
    `positive` over the `number` it calls)."""

    METHODS = ("integer", "number", "positive", "temperature", "choice", "boolean", "string",
               "fits_context", "pack_len", "rewards")

    def __init__(self):
        self.allowed: dict[str, str] = {}
        self._saved: list = []

    def __enter__(self):
        recorder = self
        for cls in (checks.Fields, checks.SectionCheck):
            for name in self.METHODS:
                if name not in vars(cls):
                    continue
                original = vars(cls)[name]

                def recorded(this, field=None, *args, _name=name, _original=original, **kw):
                    field = field if field is not None else inspect.signature(
                        _original).parameters["field"].default
                    key = f"{this.prefix}.{field}"
                    if key not in recorder.allowed:
                        recorder.allowed[key] = _allowed_text(this, _name, field, args, kw)
                    return _original(this, field, *args, **kw)

                self._saved.append((cls, name, original))
                setattr(cls, name, recorded)
        return self

    def __exit__(self, *exc):
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        return False


def _allowed_text(check, method: str, field: str, args, kw) -> str:
    if method == "integer":
        low, high = kw.get("low", 1), kw.get("high")
        if low is not None and high is not None:
            return f"int in [{low}, {high}]"
        return f"int >= {low}" if low is not None else (f"int <= {high}" if high is not None
                                                        else "int")
    if method == "number":
        low, high = kw.get("low"), kw.get("high")
        if low is None and high is None:
            return "finite number"
        left = "(" if kw.get("low_open") or low is None else "["
        right = ")" if kw.get("high_open") or high is None else "]"
        return (f"number in {left}{low if low is not None else '-inf'}, "
                f"{high if high is not None else 'inf'}{right}")
    if method == "positive":
        return "number > 0"
    if method == "temperature":
        return f"number >= {checks.MIN_TEMPERATURE:g}"
    if method == "choice":
        options = args[0] if args else kw["options"]
        return "one of " + ", ".join(f"`{o}`" for o in options)
    if method == "boolean":
        return "True or False"
    if method == "string":
        return "string"
    if method == "fits_context":
        return "int >= 1; prompt bucket + it <= model.max_seq_len"
    if method == "pack_len":
        return "int >= 0 (0 = unpacked), <= model.max_seq_len"
    if method == "rewards":
        return "reward name -> finite weight, at least one"
    return method


def _record_run_fields(config) -> dict[str, str]:
    with _Recorder() as recorder:
        validation.check_run_fields(config, KINDS)
    allowed = {re.sub(r"^config\.", "", k): v for k, v in recorder.allowed.items()}
    allowed.update(_IN_WORDS)
    return allowed


def _record_section(kind: str, config, inputs) -> dict[str, str]:
    """The checks of a fresh `kind` section in the main job's config (as its stage after
    the main job's stages), recorded until the first that needs more than the defaults."""
    section = KINDS[kind].default_section()
    with config.unlocked():
        config[f"reference_{kind}"] = section
    check = checks.SectionCheck(kind, config[f"reference_{kind}"], config=config,
                                data_parallel=1, task=inputs.task, kinds=KINDS,
                                earlier=[(n, config[n].kind)
                                         for n in checks.stage_names(config)],
                                prompt_len=inputs.prompt_len, tokenizer=inputs.tokenizer)
    with _Recorder() as recorder:
        steps = [lambda: check.temperature("temperature")] if "temperature" in section else []
        steps += [lambda g=g: g.check(check) for g in KINDS[kind].groups]
        if KINDS[kind].validate is not None:
            steps.append(lambda: KINDS[kind].validate(check))
        for step in steps:
            try:
                step()
            except (checks.ConfigError, AttributeError, KeyError, TypeError, ValueError):
                pass  # a check that needs a setting the defaults leave out
    return {re.sub(rf"^{kind}\.", "", k): v for k, v in recorder.allowed.items()}


def _leaves(node: ml_collections.ConfigDict, prefix: str = ""):
    """(dotted name, value, type name) of each field; a mapping of `_MAPPINGS` (rewards,
    mesh.shape, task.kwargs) is one field."""
    for key in node.keys():
        value, name = node[key], f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict) and name not in _MAPPINGS:
            yield from _leaves(value, f"{name}.")
        else:
            field_type = node.get_type(key) if hasattr(node, "get_type") else type(value)
            yield name, value, getattr(field_type, "__name__", str(field_type))


def _parts_comment(comments: dict[str, str], name: str) -> str:
    """A mapping field's comment from its keys' comments ("data: ...; fsdp: ...")."""
    parts = [f"{key[len(name) + 1:]}: {text}" for key, text in comments.items()
             if key.startswith(f"{name}.") and text]
    return "; ".join(parts)


def _value_text(value) -> str:
    if isinstance(value, ml_collections.ConfigDict):
        value = value.to_dict()
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict):
        return "`{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}`"
    if isinstance(value, (tuple, list)):
        if value and all(isinstance(v, (tuple, list)) for v in value):
            return "`" + ", ".join(f"{a}={b or '-'}" for a, b in value) + "`"
        return "`(" + ", ".join(str(v) for v in value) + ")`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(rows) -> list[str]:
    lines = ["| field | type | default | allowed | what it does |",
             "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _type_text(value, type_name: str) -> str:
    if isinstance(value, ml_collections.ConfigDict):
        return "mapping"
    return {"NoneType": "optional", "ConfigDict": "mapping"}.get(type_name, type_name)


def _kind_comments(kind: str) -> tuple[dict[str, str], dict[str, str]]:
    """({field: comment} of the kind's own default_section, {field: group name})."""
    build = KINDS[kind].default_section
    own = {}
    for helper in re.findall(r"^\s*(\w+)\(s\)\s*$", inspect.getsource(build), re.M):
        function = build.__globals__.get(helper)  # a helper that adds fields: helper(s)
        if inspect.isfunction(function):
            first = next(iter(inspect.signature(function).parameters))
            own.update(field_comments(function, first))
    own.update(field_comments(build, "s"))
    group_of, shared = {}, {}
    for group in KINDS[kind].groups:
        shared.update(field_comments(group.add, "s"))
        group_of.update({f: group.name for f in group.fields})
    return {**shared, **own}, group_of


def reference() -> str:
    """The page's Markdown."""
    config = config_presets.main_job(None)
    stage_sections = set(checks.stage_names(config))
    comments = field_comments(config_presets.main_job, "config")
    with contextlib.redirect_stdout(io.StringIO()):  # the task's own start-up lines
        run_allowed = _record_run_fields(config)
        inputs = build_inputs(config)
    out = [
        "# Config reference",
        "",
        f"Generated from the code by `{COMMAND}` (do not edit by hand; "
        "tests/test_user_walk.py fails when it is not current). Every field can be set "
        "on the command line (`--config.rl.beta=0.0`) or in a config file.",
        "",
        "- **default**: the main job's value (`grpo_jax/config_presets.py`, `main_job`) for "
        "run-wide fields; a stage kind's `default_section(kind)` for stage fields (a job "
        "may set others: `--print_config` shows a job's resolved values).",
        "- **allowed**: what validation checks before anything runs (one line naming the "
        "field otherwise), recorded on the defaults; a bound that depends on another field "
        "is given at that field's default, and \"-\" means the field's own code decides "
        "(see the comment).",
        "- **optional**: unset (None) takes the value the comment names.",
        "",
        "## Run-wide fields",
        "",
        "The main job's fields outside its stage sections "
        f"({', '.join(sorted(stage_sections))}).",
        "",
    ]
    rows = []
    for name, value, type_name in _leaves(config):
        if name.split(".")[0] in stage_sections:
            continue
        own, parts = comments.get(name, ""), _parts_comment(comments, name)
        comment = parts if parts and (not own or own.startswith("see `")) else \
            own or comments.get(name.rsplit(".", 1)[0], "")  # a field of a commented mapping
        rows.append((f"`{name}`", _type_text(value, type_name), _value_text(value),
                     run_allowed.get(name, "-"), comment or "-"))
    out += _table(rows)
    out += ["", "## Stage sections", "",
            "A stage is a section named in `stages` whose `kind` is one of: "
            + ", ".join(f"`{k}`" for k in KINDS) + ". Shared fields come from the field "
            "groups of `grpo_jax/runner/fields.py` (named in the group column of the "
            "comment); the others are the kind's own (`grpo_jax/stages/`).", ""]
    for kind in KINDS:
        allowed = _record_section(kind, config_presets.main_job(None), inputs)
        own, group_of = _kind_comments(kind)
        module = inspect.getmodule(KINDS[kind].default_section).__name__.replace(".", "/")
        out += [f"### `{kind}`", "", f"`default_section(\"{kind}\")`, {module}.py.", ""]
        rows = []
        for name, value, type_name in _leaves(KINDS[kind].default_section()):
            if name == "kind":
                continue
            top = name.split(".")[0]
            group = f"[{group_of[top]}] " if top in group_of else ""
            rows.append((f"`{name}`", _type_text(value, type_name), _value_text(value),
                         allowed.get(name, "-"), group + (own.get(name) or "-")))
        out += _table(rows) + [""]
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    del argv
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
