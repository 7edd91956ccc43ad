"""Task registry: `register_task(name)`, `get_task(name, **kwargs)`, `available_tasks()`."""

from __future__ import annotations

import importlib
from typing import Any, Callable

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register_task(name: str):
    """Decorator registering a Task subclass (or a factory returning a Task) under `name`.

    Re-registering the same name is allowed for the same qualified name (a module or config
    file loaded twice) and an error otherwise.

    Args:
      name: the name used by `get_task` and `--config.task.name`.

    Returns:
      decorator returning its argument unchanged (a class gets `name` set).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_task: name must be a non-empty str, got {name!r}")

    def decorator(cls_or_factory):
        previous = _REGISTRY.get(name)
        if previous is not None and _qualified(previous) != _qualified(cls_or_factory):
            raise ValueError(f"register_task: {name!r} is already registered to "
                             f"{_qualified(previous)}")
        if isinstance(cls_or_factory, type):
            cls_or_factory.name = name
        _REGISTRY[name] = cls_or_factory
        return cls_or_factory

    return decorator


def _qualified(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def available_tasks() -> list[str]:
    """Sorted names of the registered tasks."""
    return sorted(_REGISTRY)


def ensure_registered(name: str) -> None:
    """Registers the package's own task `name` (importing `grpo_jax.tasks.<name>`) if it is
    not yet; ValueError listing the available tasks when there is none."""
    if name not in _REGISTRY and isinstance(name, str) and name.isidentifier():
        module = f"grpo_jax.tasks.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    if name not in _REGISTRY:
        raise ValueError(f"task.name: unknown task {name!r}; available: {available_tasks()}")


def get_task(name: str, **kwargs):
    """Builds the task registered as `name` with keyword arguments `kwargs`.

    A name not yet registered is looked up as the module `grpo_jax.tasks.<name>` first, so
    task files in this package register themselves on first use.

    Raises:
      ValueError: unknown name (the message lists the available ones).
    """
    ensure_registered(name)
    try:
        return _REGISTRY[name](**kwargs)
    except TypeError as e:
        raise ValueError(f"task {name!r}: bad arguments {sorted(kwargs)}: {e}") from None


def task_arguments(name: str) -> set[str] | None:
    """The keyword arguments the task registered as `name` takes (its constructor's, through
    the class hierarchy); None when it takes any (**kwargs) or cannot be inspected. The name
    must be registered (`get_task` registers the package's own tasks on first use)."""
    import inspect

    factory = _REGISTRY[name]
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def task_of(name: str, kwargs: dict) -> tuple[Any, list[str]]:
    """(the task registered as `name`, built with `kwargs`, the kwargs left out): those the
    task does not take but another registered task does are that task's settings (a
    preset's arithmetic ones for a task named on the command line) and are left out; one
    no task takes goes to the constructor, whose error names it. ValueError as `get_task`."""
    ensure_registered(name)
    accepted = task_arguments(name)
    others: set[str] = set()
    for other in available_tasks():
        if other != name:
            others |= task_arguments(other) or set()
    foreign = sorted((set(kwargs) - accepted) & others) if accepted is not None else []
    task = get_task(name, **{k: v for k, v in kwargs.items() if k not in foreign})
    return task, foreign

