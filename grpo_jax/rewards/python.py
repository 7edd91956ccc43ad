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

Every call goes through one guard (`guarded_call`): a completion scores 0 and is counted by
reason, the first of each reason printed once with the function's name, when the function
- raises anything, `SystemExit` included (`exception`);
- returns a non-number (`non_number`): numbers are Python bool / int / float and numpy
  scalars of a real dtype; an array, a string, None, a dict are not;
- returns a value that is not finite or outside float32's range, |x| > 3.4e38, e.g. 1e300 or
  10**400 (`non_finite`);
- (batched) returns something that is not one value per completion: a dict, a string, a set,
  a 2-D array, a sequence or generator of another length (`bad_batch`: the whole batch
  scores 0).
`KeyboardInterrupt` from a function is the run's own stop: with the run's SIGINT handler
installed it is counted (`interrupt`), the completion scores 0 and the handler is called as
for a Ctrl-C (the run finishes its step, saves a checkpoint and stops; the same command
resumes); without one (after a second Ctrl-C, or outside a run) it propagates. A call that
takes longer than its budget (`budget_seconds` per completion it scores;
`config.python_rewards.budget_seconds`) is counted (`reward_slow`, completions) and printed
once, not stopped.

The RL loop logs the counts of each step (`reward_error_record`): `reward_errors` (every
completion scored 0 by the guard), `reward_errors/<reason>` and `reward_slow`; the run's
report totals them. The function runs in the trainer's process on the host rewards' path
(`rl.fused_steps = 0`): keep it fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import re
import reprlib
import signal
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

__all__ = ["DEFAULT_BUDGET_SECONDS", "REASONS", "guarded_call", "is_python_reward",
           "load_python_reward", "reward_error_counts", "reward_error_record", "reward_errors"]

_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")
# Why a completion scored 0 (the metrics' `reward_errors/<reason>`).
REASONS = ("exception", "interrupt", "non_number", "non_finite", "bad_batch")
SLOW = "slow"  # not an error: the completions of calls over their budget (`reward_slow`)
DEFAULT_BUDGET_SECONDS = 1.0  # per completion scored (config.python_rewards.budget_seconds)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_LOCK = threading.Lock()
_COUNTS = dict.fromkeys((*REASONS, SLOW), 0)
_REPORTED: set[tuple[str, str]] = set()


def is_python_reward(name: str) -> bool:
    """Whether a reward name is a "module:function" reference."""
    return ":" in name


def reward_errors() -> int:
    """Completions scored 0 by the guard of Python rewards (every reason), so far in this
    process."""
    with _LOCK:
        return sum(_COUNTS[reason] for reason in REASONS)


def reward_error_counts() -> dict[str, int]:
    """A snapshot of the guard's counts so far in this process: reason -> completions
    (`REASONS`, and "slow": completions scored by calls over their budget)."""
    with _LOCK:
        return dict(_COUNTS)


def reward_error_record(since: Mapping[str, int]) -> dict[str, float]:
    """The metrics of the counts since the snapshot `since` (`reward_error_counts()`):
    reward_errors (all reasons), reward_errors/<reason> for each of `REASONS`, reward_slow."""
    now = reward_error_counts()
    delta = {key: float(now[key] - since.get(key, 0)) for key in now}
    return {"reward_errors": sum(delta[reason] for reason in REASONS),
            **{f"reward_errors/{reason}": delta[reason] for reason in REASONS},
            "reward_slow": delta[SLOW]}


def load_python_reward(spec: str, *, budget_seconds: float = DEFAULT_BUDGET_SECONDS
                       ) -> Callable[[str, Any], float]:
    """The reward fn(completion, example) -> float of "module:function", called behind the
    guard (module docstring); a batched function comes with a `batched(texts, examples)`
    attribute returning one float per text. ValueError naming the spec when it is
    malformed, the module does not import or has no such callable, or budget_seconds is
    not a number > 0."""
    if not _SPEC.match(spec):
        raise ValueError(f"{spec!r}: expected module:function (e.g. my_rewards:brevity)")
    if isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float)) \
            or not budget_seconds > 0 or budget_seconds == float("inf"):
        raise ValueError(f"budget_seconds: expected a finite number > 0, got "
                         f"{budget_seconds!r}")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{spec!r}: cannot import {module_name!r} ({err}); the module must "
                         "be importable from the folder you run in, or installed") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001  (the module's own code failed)
        where = ""
        frames = traceback.extract_tb(err.__traceback__)
        try:  # the module's own line (a hook around sys.exit, e.g. wandb's, adds frames)
            origin = importlib.util.find_spec(module_name).origin
        except Exception:  # noqa: BLE001
            origin = None
        own = [f for f in frames if f.filename == origin] or frames
        if isinstance(err, SyntaxError) and err.filename:
            where = f" at {err.filename}:{err.lineno}"
        elif own:
            where = f" at {own[-1].filename}:{own[-1].lineno}"
        message = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{spec!r}: importing {module_name!r} failed{where}: "
                         f"{type(err).__name__}{': ' + message if message else ''}") from None
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
        def batched(texts, examples) -> list[float]:
            texts, examples = list(texts), list(examples)
            metas = [meta_of(ex) for ex in examples]
            keys = {k for meta in metas for k in meta}
            return guarded_call(
                spec, lambda: fn(prompts=[ex.prompt for ex in examples], completions=texts,
                                 answers=[ex.answer for ex in examples],
                                 **{k: [meta.get(k) for meta in metas] for k in keys}),
                count=len(texts), budget_seconds=budget_seconds, batched=True)

        def one(completion, example):
            return batched([completion], [example])[0]

        one.batched = batched
        return one

    def reward(completion, example):
        meta = meta_of(example)
        return guarded_call(
            spec, lambda: fn(example.prompt, completion, example.answer, **meta), count=1,
            budget_seconds=budget_seconds, batched=False)[0]

    return reward


class _BadBatch(Exception):
    """A batched function's result is not one value per completion."""


def guarded_call(name: str, call: Callable[[], Any], *, count: int, budget_seconds: float,
                 batched: bool) -> list[float]:
    """The guard: `count` floats from `call()` (one value, or with `batched` one value per
    completion), each a finite float32-range number, or 0.0 where it is not; every failure
    counted and the first of each reason printed once with `name` (module docstring)."""
    start = time.perf_counter()
    try:
        try:
            value = call()
            values = _batch(value, count) if batched else [value]
        except _BadBatch as err:
            _failed(name, "bad_batch", str(err), count)
            return [0.0] * count
        except KeyboardInterrupt as err:
            _interrupted(name, err, count)
            return [0.0] * count
        except BaseException as err:  # noqa: BLE001  a user's function: scored 0, counted
            _failed(name, "exception", _text(err), count)
            return [0.0] * count
        return [_number(name, v) for v in values]
    finally:
        elapsed = time.perf_counter() - start
        if count and elapsed > budget_seconds * count:
            _slow(name, elapsed, count, budget_seconds)


def _batch(values, count: int) -> list:
    """A batched function's result as a list of `count` values (not yet checked to be
    numbers); _BadBatch when it is not one value per completion."""
    if isinstance(values, (str, bytes, Mapping, set, frozenset)) or values is None:
        raise _BadBatch(f"returned a {type(values).__name__}, expected one number per "
                        f"completion ({count})")
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise _BadBatch(f"returned an array of shape {values.shape}, expected "
                            f"({count},)")
        values = values.tolist() if values.dtype.kind in "biuf" else list(values)
    try:
        iterator = iter(values)
    except TypeError:
        raise _BadBatch(f"returned a {type(values).__name__}, expected one number per "
                        f"completion ({count})") from None
    out = list(itertools.islice(iterator, count + 1))  # an endless generator ends here
    if len(out) != count:
        got = f"more than {count}" if len(out) > count else str(len(out))
        raise _BadBatch(f"returned {got} values for {count} completions")
    return out


def _number(name: str, value) -> float:
    """`value` as a float when it is a finite number within float32's range, else 0.0
    (counted)."""
    number = value
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        number = float(value) if value.dtype.kind == "f" else value.item()  # longdouble too
    if not isinstance(number, (bool, int, float)):
        _failed(name, "non_number", f"returned {_shown(value)}, expected a number", 1)
        return 0.0
    # An int is compared exactly: 10**400 is out of range, not an OverflowError.
    if not -_FLOAT32_MAX <= number <= _FLOAT32_MAX:  # also False for nan
        _failed(name, "non_finite", f"returned {_shown(value)}, outside float32's finite "
                                    "range", 1)
        return 0.0
    return float(number)


def _interrupted(name: str, err: KeyboardInterrupt, count: int) -> None:
    """KeyboardInterrupt from a function: the run's own stop (module docstring)."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler) or handler is signal.default_int_handler:
        raise err  # no run's handler (or a second Ctrl-C reset it): a plain interrupt
    _failed(name, "interrupt", f"{_text(err)}; the run stops as on SIGINT", count)
    handler(signal.SIGINT, None)


def _counted(name: str, reason: str, count: int) -> bool:
    """Adds `count` to `reason`'s counter; whether this is `name`'s first of that reason."""
    with _LOCK:
        _COUNTS[reason] += count
        first = (name, reason) not in _REPORTED
        _REPORTED.add((name, reason))
    return first


def _slow(name: str, elapsed: float, count: int, budget_seconds: float) -> None:
    if _counted(name, SLOW, count):
        print(f"[grpo_jax] warning: reward {name}: took {elapsed:.2f}s for {count} "
              f"completion{'s' if count != 1 else ''}, over its budget of {budget_seconds:g}s "
              "per completion (python_rewards.budget_seconds); its scores are kept, such "
              "calls are counted in reward_slow", flush=True)


def _failed(name: str, reason: str, what: str, count: int) -> None:
    if _counted(name, reason, count):
        print(f"[grpo_jax] warning: reward {name}: {what}; such completions score 0 "
              f"(counted in reward_errors/{reason})", flush=True)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def _shown(value) -> str:
    """A short repr of a user's value that cannot raise (a huge int, a failing __repr__)."""
    try:
        if isinstance(value, int) and value.bit_length() > 200:
            return f"an int of {value.bit_length()} bits"
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001
        return f"a {type(value).__name__}"


def _text(err: BaseException) -> str:
    """"Type: message" of an exception (at most 200 characters of message), that cannot
    raise."""
    try:
        text = str(err)
    except Exception:  # noqa: BLE001
        text = "(unprintable)"
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
