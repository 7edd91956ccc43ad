"""A task's held-out problems scored through an OpenAI-compatible endpoint, as an external
harness scores a model: one chat request a problem, the reply scored by the task's own
accuracy reward.

    python -m grpo_jax.serve.eval --base-url http://127.0.0.1:8000/v1 --task arithmetic --n 64

The problems are the task's held-out split drawn with `--eval-seed` (a run's task.eval_seed:
the run's own evaluation problems); each is sent as one user message (`--user-template`
around the question), greedy by default (`--temperature 0`), `--concurrency` requests at a
time. It prints pass@1 (the share of problems whose reply the accuracy reward solves) and
the accuracy reward's mean. It speaks HTTP with the standard library only.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import urllib.error
import urllib.request

from grpo_jax.command_line import OneLineParser

__all__ = ["EndpointError", "score_endpoint", "main"]

QUESTION = "{question}"


class EndpointError(RuntimeError):
    """The endpoint refused a request or could not be reached (one line)."""


def _call(base_url: str, path: str, body: dict | None, timeout: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url.rstrip("/") + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = err.reason
        raise EndpointError(f"{base_url}{path}: HTTP {err.code}: {message}") from None
    except (urllib.error.URLError, OSError) as err:
        raise EndpointError(f"{base_url}{path}: {getattr(err, 'reason', err)}") from None


def served_models(base_url: str, *, timeout: float = 60.0) -> list[str]:
    """The model ids of `GET /v1/models`."""
    return [entry["id"] for entry in _call(base_url, "/models", None, timeout)["data"]]


def score_endpoint(base_url: str, task, examples, *, model: str | None = None,
                   max_tokens: int = 40, temperature: float = 0.0, seed: int = 0,
                   concurrency: int = 16, user_template: str = QUESTION,
                   timeout: float = 600.0) -> dict:
    """Each example's question sent to the endpoint as one user message; the replies scored
    with the task's accuracy reward.

    Args:
      base_url: the endpoint's root, e.g. "http://127.0.0.1:8000/v1".
      task: a `tasks.Task` (its `reward_fns()["accuracy"]`).
      examples: the problems (`Task.examples`).
      model: the model id (None: the first the endpoint serves).
      max_tokens, temperature, seed: each request's (temperature 0: greedy).
      concurrency: requests in flight at once.
      user_template: the user message, with "{question}" for the question.

    Returns:
      {"pass@1", "reward/accuracy" (the mean), "num_problems", "texts"}.
    """
    if QUESTION not in user_template:
        raise ValueError(f"--user-template: expected a string containing {QUESTION!r}, got "
                         f"{user_template!r:.60}")
    model = model or served_models(base_url)[0]
    accuracy = task.reward_fns()["accuracy"]

    def reply(example) -> str:
        body = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
                "seed": seed, "messages": [
                    {"role": "user", "content": user_template.replace(QUESTION,
                                                                      example.prompt)}]}
        return _call(base_url, "/chat/completions", body, timeout)["choices"][0][
            "message"]["content"] or ""

    with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as pool:
        texts = list(pool.map(reply, examples))
    from grpo_jax.evals.metrics import solved

    rewards = [float(accuracy(text, example)) for text, example in zip(texts, examples)]
    count = max(1, len(rewards))
    return {"pass@1": sum(bool(solved(r)) for r in rewards) / count,
            "reward/accuracy": sum(rewards) / count, "num_problems": len(rewards),
            "texts": texts}


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, or 2 with one line on stderr)."""
    parser = OneLineParser(prog="python -m grpo_jax.serve.eval", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--task", required=True, help="a registered task, e.g. arithmetic")
    parser.add_argument("--task-kwargs", default="{}", help="the task's arguments, JSON")
    parser.add_argument("--n", type=int, default=64, help="held-out problems")
    parser.add_argument("--eval-seed", type=int, default=0,
                        help="the held-out draw's seed (a run's task.eval_seed)")
    parser.add_argument("--model", default=None, help="model id (default: the served one)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="each request's seed")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--user-template", default=QUESTION,
                        help="the user message around the question ({question})")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    from grpo_jax import tasks as tasks_lib

    try:
        kwargs = json.loads(args.task_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError(f"expected a JSON object, got {args.task_kwargs!r:.60}")
    except ValueError as err:
        print(f"error: --task-kwargs: {err}", file=sys.stderr)
        return 2
    if args.n < 1:
        print(f"error: --n: expected a positive count, got {args.n}", file=sys.stderr)
        return 2
    try:
        task = tasks_lib.task_of(args.task, kwargs)[0]
        examples = task.examples("test", args.n, seed=args.eval_seed)
        figures = score_endpoint(args.base_url, task, examples, model=args.model,
                                 max_tokens=args.max_tokens, temperature=args.temperature,
                                 seed=args.seed, concurrency=args.concurrency,
                                 user_template=args.user_template)
    except (ValueError, EndpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.task}: pass@1={figures['pass@1']:.4f} "
          f"reward/accuracy={figures['reward/accuracy']:.4f} "
          f"num_problems={figures['num_problems']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
