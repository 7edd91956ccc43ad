"""The policy behind the server: a loaded policy (`ServedPolicy`) and the scheduler thread that
samples the waiting requests together (`Engine`).

Every batch is one `sampling.generate` call, the decode core's continuous-batching layout
(`SamplingConfig.slots` rows decoded at once, a slot taking the next row when its row ends)
when the batch has more rows than slots. Shapes are bucketed so that each compiles once: the
rows to a power of two (padding rows are copies of the first, their samples dropped), the
prompt to a power of two of at least `MIN_BUCKET` columns, the completion to a power of two of
at least `MIN_BUCKET` columns (a row's own `max_tokens` cuts it). Row i of a request with seed s
chooses its column t with the key fold_in(fold_in(key(s), i), t), the key `generate` gives row i
of a batch sampled with key(s): a request's completions do not depend on the requests it was
batched with (to the float rounding of different batch shapes).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.sampling import SamplingConfig, generate, pad_prompts

__all__ = ["Completion", "Engine", "Request", "ServedPolicy", "Settings", "load_policy",
           "served_model"]

MIN_BUCKET = 16  # the fewest prompt and completion columns of a batch shape
SEED_LIMIT = 2 ** 31  # seeds are in [0, SEED_LIMIT)


@dataclasses.dataclass
class ServedPolicy:
    """A policy as the server holds it.

    Attributes:
      name: the model id clients ask for (`GET /v1/models`).
      tokenizer: the policy's tokenizer (`text.Tokenizer`; its `chat_template`, when it has
        one, renders chat requests).
      graphdef, state: the model (`nnx.split`), parameters bound.
      context: the longest prompt + completion, in tokens (the model's max_seq_len).
      prompt_of_question: the run's own prompt for one question (its task.template, the
        trainer's `runner.prompts.prompt_of`), used for a chat of one user message when the
        tokenizer has no chat template; None: such a policy serves completions only.
    """

    name: str
    tokenizer: Any
    graphdef: Any
    state: Any
    context: int
    prompt_of_question: Callable[[str], str] | None = None

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)


def served_model(model, tokenizer, *, name: str,
                 prompt_of_question: Callable[[str], str] | None = None) -> ServedPolicy:
    """A `ServedPolicy` of an NNX Transformer in memory (its parameters as they are)."""
    from flax import nnx

    graphdef, state = nnx.split(model)
    return ServedPolicy(name, tokenizer, graphdef, state, int(model.config.max_seq_len),
                        prompt_of_question)


def load_policy(path: str, *, name: str | None = None) -> ServedPolicy:
    """The policy in `path`: a grpo_jax run directory (its final policy, `FinishedRun.policy`,
    prompted with the run's template), its checkpoints/ folder, or a Hugging Face checkpoint
    directory (an export of `grpo_jax.export`: config.json, *.safetensors and tokenizer.json).

    Raises:
      FileNotFoundError / ValueError: one line naming `path` and what was expected.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--workdir: {path!r} is not a directory; expected a run "
                                "directory, its checkpoints/ folder or an exported checkpoint")
    if os.path.basename(path) == "checkpoints" and os.path.isfile(
            os.path.join(os.path.dirname(path), "config.json")):
        path = os.path.dirname(path)
    name = name or os.path.basename(path)
    if os.path.isfile(os.path.join(path, "config.json")) and any(
            f.endswith(".safetensors") for f in os.listdir(path)):
        return _load_export(path, name)
    from grpo_jax.results import FinishedRun
    from grpo_jax.runner.prompts import prompt_of

    trained = FinishedRun(path).policy
    config, task, tokenizer = trained.config, trained.task, trained.tokenizer
    state = trained.policy.state(trained.params)
    return ServedPolicy(name, tokenizer, trained.policy.graphdef, state,
                        int(config.model.max_seq_len),
                        lambda question: prompt_of(config, task, tokenizer, question))


def _load_export(path: str, name: str) -> ServedPolicy:
    from flax import nnx

    from grpo_jax.models import from_pretrained
    from grpo_jax.text import HFTokenizer

    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise FileNotFoundError(f"--workdir: {path} has no tokenizer.json; expected a "
                                "checkpoint with its tokenizer (or serve the run directory)")
    tokenizer = HFTokenizer(path)
    model, config = from_pretrained(path)
    graphdef, state = nnx.split(model)
    return ServedPolicy(name, tokenizer, graphdef, state, int(config.max_seq_len))


@dataclasses.dataclass(frozen=True)
class Settings:
    """A request's token choice (requests batch together when theirs are equal).

    Attributes:
      temperature: 0 is greedy decoding (the argmax).
      top_p: nucleus mass kept (1 keeps all).
      top_k: the most likely tokens kept (0 keeps all).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass
class Request:
    """`n` completions of one prompt.

    Attributes:
      prompt_ids: the prompt's token ids (BOS included when the tokenizer has one).
      n: completions.
      max_tokens: the most tokens of each.
      settings: token choice.
      seed: completion i draws with fold_in(jax.random.key(seed), i).
    """

    prompt_ids: Sequence[int]
    n: int
    max_tokens: int
    settings: Settings
    seed: int

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + self.max_tokens


@dataclasses.dataclass
class Completion:
    """One sampled completion: its tokens (EOS included), each token's log-prob under the
    distribution it was drawn from (`SampleOutput.logp`), and whether it ended with EOS."""

    tokens: list[int]
    logprobs: list[float]
    ended: bool


def _power_of_two(n: int, low: int = 1) -> int:
    return max(low, 1 << max(0, int(n) - 1).bit_length())


@jax.jit
def _row_keys(seeds, indices):
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds, indices)


class Engine:
    """Samples requests in batches on a scheduler thread.

    `submit(request)` queues a request and returns a Future of its `Completion`s. The thread
    takes the oldest waiting request, waits `batch_wait_s` for others to arrive, and samples
    every waiting request with the same `Settings` that fits (rows up to `max_rows`, the
    longest prompt + the most tokens within the context) in one `generate` call.

    Args:
      served: the ServedPolicy.
      max_rows: the most rows (completions) of one batch.
      slots: rows decoded at once (continuous batching); a batch of at most this many rows
        decodes them all at once.
      batch_wait_s: how long the oldest request waits for others to join its batch.
    """

    def __init__(self, served: ServedPolicy, *, max_rows: int = 64, slots: int = 16,
                 batch_wait_s: float = 0.01):
        if max_rows < 1 or slots < 1 or batch_wait_s < 0:
            raise ValueError(f"Engine: max_rows {max_rows} and slots {slots} must be >= 1, "
                             f"batch_wait_s {batch_wait_s} >= 0")
        self.served, self.max_rows, self.slots = served, max_rows, slots
        self.batch_wait_s = batch_wait_s
        self._waiting: list[tuple[Request, concurrent.futures.Future]] = []
        self._lock = threading.Condition()
        self._closed = False
        self.batches: list[int] = []  # the rows of each batch sampled (for tests and logs)
        self._thread = threading.Thread(target=self._loop, name="grpo_jax-serve", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> concurrent.futures.Future:
        """Queues `request`; the Future gives its n Completions (or the sampler's error)."""
        if request.n > self.max_rows:
            raise ValueError(f"n: {request.n} exceeds the server's {self.max_rows} rows a batch")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("Engine: closed")
            self._waiting.append((request, future))
            self._lock.notify()
        return future

    def close(self) -> None:
        """Stops the thread after the batch in progress; waiting requests fail."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join()
        for _, future in self._waiting:
            future.set_exception(RuntimeError("Engine: closed"))
        self._waiting.clear()

    def _take_batch(self) -> list[tuple[Request, concurrent.futures.Future]]:
        """The oldest waiting request and every later one that joins it (same settings, the
        rows and the context still fit), removed from the queue."""
        first = self._waiting[0][0]
        rows, prompt, new = 0, 0, 0
        batch, rest = [], []
        for request, future in self._waiting:
            longest = max(prompt, len(request.prompt_ids))
            most = max(new, request.max_tokens)
            if (request.settings == first.settings and rows + request.n <= self.max_rows
                    and longest + most <= self.served.context):
                batch.append((request, future))
                rows, prompt, new = rows + request.n, longest, most
            else:
                rest.append((request, future))
        self._waiting[:] = rest
        return batch

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
            if self.batch_wait_s:  # let the requests sent with this one arrive
                time.sleep(self.batch_wait_s)
            with self._lock:
                batch = self._take_batch()
            try:
                results = self.sample([request for request, _ in batch])
            except Exception as err:  # noqa: BLE001  each request gets the sampler's error
                for _, future in batch:
                    future.set_exception(err)
                continue
            for (_, future), completions in zip(batch, results):
                future.set_result(completions)

    def warm_up(self, prompt_tokens: int, max_tokens: int, settings: Settings) -> int:
        """Compiles the batch shapes that requests of `prompt_tokens` prompt tokens, at most
        `max_tokens` new ones and `settings` meet (every power-of-two row count up to
        max_rows), so that no request waits for a compile; returns the shapes run."""
        request = Request([self.served.tokenizer.pad_id] * prompt_tokens, 1, max_tokens,
                          settings, 0)
        rows, shapes = 1, 0
        while rows <= _power_of_two(self.max_rows):
            self.sample([request] * min(rows, self.max_rows))
            rows, shapes = rows * 2, shapes + 1
        del self.batches[-shapes:]
        return shapes

    def sample(self, requests: Sequence[Request]) -> list[list[Completion]]:
        """The requests' completions from one `generate` call (the batch's bucketed shape).

        Raises:
          ValueError: the requests' settings differ or they do not fit the context together.
        """
        served, tokenizer = self.served, self.served.tokenizer
        settings = requests[0].settings
        if any(r.settings != settings for r in requests):
            raise ValueError("Engine.sample: the requests of one batch share their settings")
        prompts = [list(r.prompt_ids) for r in requests for _ in range(r.n)]
        seeds = [r.seed for r in requests for _ in range(r.n)]
        indices = [i for r in requests for i in range(r.n)]
        longest = max(map(len, prompts))
        most = max(r.max_tokens for r in requests)
        if longest + most > served.context:
            raise ValueError(f"Engine.sample: prompt {longest} + max_tokens {most} exceeds the "
                             f"context {served.context}")
        new = min(_power_of_two(most, MIN_BUCKET), served.context - longest)
        bucket = max(longest, min(_power_of_two(longest, MIN_BUCKET), served.context - new))
        rows = _power_of_two(len(prompts))
        padding = rows - len(prompts)
        tokens, mask = pad_prompts(prompts + [prompts[0]] * padding, bucket,
                                   pad_id=tokenizer.pad_id)
        keys = _row_keys(jnp.asarray(seeds + [seeds[0]] * padding, jnp.int32),
                         jnp.asarray(indices + [indices[0]] * padding, jnp.int32))
        config = SamplingConfig(
            max_new_tokens=new, greedy=settings.greedy,
            temperature=settings.temperature if not settings.greedy else 1.0,
            top_p=settings.top_p, top_k=settings.top_k, eos_ids=tuple(tokenizer.eos_ids),
            pad_id=tokenizer.pad_id, slots=self.slots if self.slots < rows else 0)
        out = generate(served.graphdef, served.state, tokens, mask, keys, config=config)
        out_tokens, logp, lengths = jax.device_get((out.tokens, out.logp, out.lengths))
        self.batches.append(len(prompts))
        eos = set(tokenizer.eos_ids)
        results, row = [], 0
        for request in requests:
            completions = []
            for _ in range(request.n):
                length = min(int(lengths[row]), request.max_tokens)
                ids = [int(t) for t in out_tokens[row, :length]]
                completions.append(Completion(ids, [float(x) for x in logp[row, :length]],
                                              bool(ids) and ids[-1] in eos))
                row += 1
            results.append(completions)
        return results


def check_seed(seed) -> int:
    """`seed` as an int in [0, SEED_LIMIT) (ValueError otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"expected an integer in [0, {SEED_LIMIT}), got {seed!r}")
    return int(seed)
