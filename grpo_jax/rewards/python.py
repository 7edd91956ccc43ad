"""Rewards written as plain Python functions, named in a config as "module:function".

    # my_rewards.py (importable: in the folder you run from, or installed)
    def brevity(prompt, completion, answer, **meta):
        return 1.0 if len(completion) < 40 else 0.0

    config.rl.rewards = {"accuracy": 1.0, "my_rewards:brevity": 0.2}

A per-sample function is called as `fn(prompt, completion, answer, **meta)` with the problem's
`id`, `difficulty` and the task's `meta` entries as keywords (only those it declares, unless it
takes `**meta`). A function whose first parameter is named `completions` is batched:
`fn(prompts=[...], completions=[...], answers=[...], **meta)` with lists, once per rollout,
returning one number per completion (the form TRL's reward functions take).

A function that raises, or returns something that is not a finite number, scores 0 for that
completion; the run goes on, counts it (`reward_errors()`, logged per RL step as
`reward_errors`) and prints the first failure of each function once. The function runs in the
trainer's process on the host rewards' path (`rl.fused_steps = 0`): keep it fast.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import threading
from typing import Any, Callable

__all__ = ["is_python_reward", "load_python_reward", "reward_errors"]

_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")
_LOCK = threading.Lock()
_ERRORS = {"count": 0}
_REPORTED: set[str] = set()


def is_python_reward(name: str) -> bool:
    """Whether a reward name is a "module:function" reference."""
    return ":" in name


def reward_errors() -> int:
    """Completions scored 0 because a Python reward raised or returned a non-number, so far
    in this process."""
    return _ERRORS["count"]


def load_python_reward(spec: str) -> Callable[[str, Any], float]:
    """The reward fn(completion, example) -> float of "module:function"; a batched function
    comes with a `batched(texts, examples)` attribute. ValueError naming the spec when it is
    malformed, the module does not import or has no such callable."""
    if not _SPEC.match(spec):
        raise ValueError(f"{spec!r}: expected module:function (e.g. my_rewards:brevity)")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{spec!r}: cannot import {module_name!r} ({err}); the module must "
                         "be importable from the folder you run in, or installed") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {module_name} has no function {attr!r}")
    params = list(inspect.signature(fn).parameters.values())
    keywords = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params}

    def meta_of(example) -> dict:
        meta = {"id": example.id, "difficulty": example.difficulty, **dict(example.meta)}
        return meta if keywords else {k: v for k, v in meta.items() if k in names}

    if params and params[0].name == "completions":
        def batched(texts, examples):
            metas = [meta_of(ex) for ex in examples]
            keys = {k for meta in metas for k in meta}
            try:
                values = fn(prompts=[ex.prompt for ex in examples], completions=list(texts),
                            answers=[ex.answer for ex in examples],
                            **{k: [meta.get(k) for meta in metas] for k in keys})
                values = list(values)
                if len(values) != len(texts):
                    raise ValueError(f"returned {len(values)} values for {len(texts)} "
                                     "completions")
            except Exception as err:  # noqa: BLE001  a user's function: scored 0, counted
                _failed(spec, err, len(texts))
                return [0.0] * len(texts)
            return [_number(spec, v) for v in values]

        def one(completion, example):
            return batched([completion], [example])[0]

        one.batched = batched
        return one

    def reward(completion, example):
        try:
            value = fn(example.prompt, completion, example.answer, **meta_of(example))
        except Exception as err:  # noqa: BLE001  a user's function: scored 0, counted
            _failed(spec, err, 1)
            return 0.0
        return _number(spec, value)

    return reward


def _number(spec: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(float(value)):
        if hasattr(value, "item"):  # a numpy / jax scalar
            return _number(spec, value.item())
        _failed(spec, TypeError(f"returned {value!r}, expected a finite number"), 1)
        return 0.0
    return float(value)


def _failed(spec: str, err: BaseException, count: int) -> None:
    with _LOCK:
        _ERRORS["count"] += count
        first = spec not in _REPORTED
        _REPORTED.add(spec)
    if first:
        print(f"[grpo_jax] warning: reward {spec}: {type(err).__name__}: {err}; such "
              "completions score 0 (counted in reward_errors)", flush=True)
