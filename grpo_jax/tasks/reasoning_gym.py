"""reasoning-gym's procedural generators as a task (https://github.com/open-thought/reasoning-gym).

    python -m grpo_jax.main --config=configs/reasoning_gym_tasks.py \
        --config.task.kwargs.datasets=chain_sum:2,spell_backward:1

`datasets` names reasoning-gym generators, each with an optional weight ("name:weight"); the
problems of a split are drawn from them in proportion to the weights by a smooth weighted
round-robin, so every prefix of a split holds each dataset within one problem of its share.
`dataset_kwargs` maps a dataset name to its generator's settings (`min_terms`, `max_words`,
...; the fields of the generator's config dataclass).

Splits: the training and held-out problems of a dataset come from two generator seeds derived
from (dataset, split, seed), and a problem belongs to the held-out split iff a stable hash of
its question falls in the first `test_fraction` of the hash range (`base.split_of`), so the
two splits never share a question even where the generators' streams overlap (reasoning-gym
seeds item i of seed s with s + i).

Scoring: the answer inside the last `<answer>...</answer>` is scored by the dataset's own
`score_answer(answer, entry)`, called behind the guard of Python rewards
(`grpo_jax.rewards.python.guarded_call`): a scorer that raises, returns a non-number or a
non-finite one scores 0 and is counted in the step's `reward_errors`; a value outside [0, 1]
is clipped to it. "accuracy" is that score (partial credit where the scorer gives it);
a completion is "correct" when it scores 1.

Worked solutions (the pretraining corpus): where a generator's metadata has the steps, the
thinking writes them, and a noisy solution gets each step wrong with probability
`error_rate`, later steps and the answer following the wrong value:

- chain_sum: left-to-right partial sums, "3+4=7 7-2=5" (a wrong step is off by 1..3);
- letter_counting: the target letter's count in each word, "the:0 second:1" (off by 1);
- spell_backward: the letters from last to first, "e s u o h" (a wrong letter);
- count_bits: the binary representation, "1101" (one bit flipped).

Other datasets get an empty thinking and, with probability `error_rate`, a wrong answer: a
number off by 1..3, else one character changed. Every solution is scored by the dataset's
scorer, so its correct flag is honest.

Vocabulary: `characters` are the characters of a sample of generated problems and solutions
(the first VOCABULARY_SAMPLE items of each dataset's generators for seed 0) that the
character tokenizer's default alphabet lacks. A problem whose question or clean solution
has a character outside the alphabet and `characters` (a rare letter, e.g. "ë" in
letter_counting's text) is skipped by `examples`, so every problem a run draws encodes.
"""

from __future__ import annotations

import string
import sys
from typing import Any, Callable, Mapping

import numpy as np

from grpo_jax.rewards.accuracy import parse_number
from grpo_jax.rewards.python import DEFAULT_BUDGET_SECONDS, guarded_call
from grpo_jax.tasks.base import (SPLITS, Example, Task, check_rate, perturb, split_of,
                                 stable_hash)
from grpo_jax.tasks.registry import register_task
from grpo_jax.tasks.templates import format_completion
from grpo_jax.text.char import DEFAULT_ALPHABET

__all__ = ["ReasoningGymTask", "WORKED_STEPS", "parse_datasets"]

INSTALL = 'pip install -e ".[reasoning_gym]"'
# Problems per dataset whose characters make the vocabulary (`characters`).
VOCABULARY_SAMPLE = 200
# Generator indices tried per problem asked for before a split is declared too small.
ATTEMPTS_PER_PROBLEM = 50
_VIRTUAL_SIZE = 2**31 - 1  # reasoning-gym datasets are indexed, not stored


def _reasoning_gym():
    """The reasoning_gym module; ValueError naming the install command when it is absent."""
    try:
        import reasoning_gym  # pylint: disable=import-outside-toplevel
        from reasoning_gym import factory  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        found = getattr(sys.modules.get("reasoning_gym"), "__file__", None)
        if found and err.name != "reasoning_gym":
            raise ValueError(f"'import reasoning_gym' finds {found}, not the reasoning-gym "
                             "package: rename that file") from None
        raise ValueError(f"the reasoning-gym package is not installed; {INSTALL}") from None
    return reasoning_gym, factory.DATASETS


def parse_datasets(datasets) -> dict[str, float]:
    """{name: weight} of "a,b:2" (weight 1 where none is given), a list of names, or a dict.

    Raises:
      ValueError: "datasets: ..." for an empty list, a repeated name, or a weight that is not
        a number > 0.
    """
    if isinstance(datasets, Mapping):
        items = [(str(k), v) for k, v in datasets.items()]
    else:
        parts = datasets.split(",") if isinstance(datasets, str) else list(datasets)
        items = []
        for part in parts:
            name, _, weight = str(part).strip().partition(":")
            items.append((name.strip(), weight.strip() or 1.0))
    out: dict[str, float] = {}
    for name, weight in items:
        if not name:
            raise ValueError(f"datasets: expected 'name[:weight],...', got {datasets!r}")
        if name in out:
            raise ValueError(f"datasets: {name!r} is named twice")
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 < value < float("inf") or isinstance(weight, bool):
            raise ValueError(f"datasets: the weight of {name!r} must be a number > 0, got "
                             f"{weight!r}")
        out[name] = value
    if not out:
        raise ValueError(f"datasets: expected at least one reasoning-gym dataset, got "
                         f"{datasets!r}")
    return out


# ---- worked steps from a generator's metadata -----------------------------------------------
# name -> steps(entry, rng, error_rate) -> (thinking, answer); rng None: the clean solution.

def _wrong(rng, error_rate) -> bool:
    return rng is not None and rng.random() < error_rate


def _chain_sum_steps(entry, rng, error_rate):
    tokens = entry["metadata"]["expression"].split()
    value, steps = int(tokens[0]), []
    for operator, term in zip(tokens[1::2], tokens[2::2]):
        result = value + int(term) if operator == "+" else value - int(term)
        if _wrong(rng, error_rate):
            result = perturb(result, rng)
        steps.append(f"{value}{operator}{term}={result}")
        value = result
    return " ".join(steps), str(value)


def _letter_counting_steps(entry, rng, error_rate):
    meta = entry["metadata"]
    letter, steps, total = meta["target_letter"], [], 0
    for word in meta["span"]:
        count = word.lower().count(letter)
        if _wrong(rng, error_rate):
            count = count + 1 if count == 0 or rng.random() < 0.5 else count - 1
        steps.append(f"{word}:{count}")
        total += count
    return " ".join(steps), str(total)


def _spell_backward_steps(entry, rng, error_rate):
    letters = list(entry["metadata"]["word"][::-1])
    for i, letter in enumerate(letters):
        if _wrong(rng, error_rate):
            others = sorted(set(letters) - {letter}) or [c for c in string.ascii_lowercase
                                                         if c != letter.lower()]
            letters[i] = others[int(rng.integers(len(others)))]
    return " ".join(letters), "".join(letters)


def _count_bits_steps(entry, rng, error_rate):
    bits = list(entry["metadata"]["binary"])
    if _wrong(rng, error_rate):
        i = int(rng.integers(len(bits)))
        bits[i] = "1" if bits[i] == "0" else "0"
    return "".join(bits), str(bits.count("1"))


WORKED_STEPS: dict[str, Callable[[dict, Any, float], tuple[str, str]]] = {
    "chain_sum": _chain_sum_steps,
    "letter_counting": _letter_counting_steps,
    "spell_backward": _spell_backward_steps,
    "count_bits": _count_bits_steps,
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _near_miss(answer: str, rng: np.random.Generator) -> str:
    """A wrong answer close to `answer`: a number off by 1..3, else one character changed."""
    value = parse_number(answer)
    if value is not None and value.denominator == 1:
        return str(perturb(int(value), rng))
    if not answer:
        return "0"
    i = int(rng.integers(len(answer)))
    pool = [c for c in string.ascii_lowercase + string.digits if c != answer[i]]
    return answer[:i] + pool[int(rng.integers(len(pool)))] + answer[i + 1:]


# ---- the task ------------------------------------------------------------------------------

@register_task("reasoning_gym")
class ReasoningGymTask(Task):
    """Problems of reasoning-gym generators, scored by each dataset's own `score_answer`.

    Args:
      datasets: "name[:weight],..." (or a list of names, or {name: weight}).
      dataset_kwargs: {dataset name: {generator setting: value}}; names not in `datasets`
        are allowed (a preset's settings for other mixes) but must be reasoning-gym
        datasets.
      test_fraction: the share of each dataset's question space held out (0 < f < 1).
      score_budget_seconds: a scorer call longer than this is counted as `reward_slow`.
    """

    name = "reasoning_gym"
    guarded_rewards = ("accuracy",)

    def __init__(self, datasets: Any = "chain_sum", *,
                 dataset_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 test_fraction: float = 0.1,
                 score_budget_seconds: float = DEFAULT_BUDGET_SECONDS):
        super().__init__(difficulty=1)
        self.weights = parse_datasets(datasets)
        dataset_kwargs = dict(dataset_kwargs or {})
        if not _is_number(test_fraction) or not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction: expected a number in (0, 1), got {test_fraction!r}")
        self.test_fraction = float(test_fraction)
        if not _is_number(score_budget_seconds) or not score_budget_seconds > 0:
            raise ValueError(f"score_budget_seconds: expected a number > 0, got "
                             f"{score_budget_seconds!r}")
        self.score_budget_seconds = float(score_budget_seconds)
        rg, registered = _reasoning_gym()
        for field, names in (("datasets", self.weights), ("dataset_kwargs", dataset_kwargs)):
            for name in names:
                if name not in registered:
                    raise ValueError(f"{field}: unknown reasoning-gym dataset {name!r}; "
                                     f"available: {', '.join(sorted(registered))}")
        for name, settings in dataset_kwargs.items():
            if not isinstance(settings, Mapping):
                raise ValueError(f"dataset_kwargs: {name!r} must map setting names to values, "
                                 f"got {settings!r}")
        self.dataset_kwargs = {name: dict(dataset_kwargs.get(name, {})) for name in self.weights}
        self._rg = rg
        self._datasets: dict[tuple[str, int], Any] = {}
        self._entries: dict[tuple[str, int, int], dict] = {}
        self._examples: dict[tuple[str, int, int], Example] = {}
        for name in self.weights:  # a bad setting is one line now, before any work
            self._dataset(name, 0)
        self.characters = self._vocabulary()
        self._alphabet = set(DEFAULT_ALPHABET + self.characters)

    # ---- generators ----------------------------------------------------------------------

    def _dataset(self, name: str, seed: int):
        key = (name, seed)
        if key not in self._datasets:
            settings = {k: tuple(v) if isinstance(v, list) else v
                        for k, v in self.dataset_kwargs.get(name, {}).items()}
            try:
                self._datasets[key] = self._rg.create_dataset(name, seed=seed,
                                                              size=_VIRTUAL_SIZE, **settings)
            except (TypeError, AssertionError, ValueError) as err:
                message = " ".join(str(err).split()) or type(err).__name__
                raise ValueError(f"dataset_kwargs: {name}: {message}") from None
        return self._datasets[key]

    def _seed(self, name: str, split: str, seed: int) -> int:
        """The generator seed of (dataset, split, run seed)."""
        return stable_hash(f"reasoning_gym:{name}:{split}:{int(seed)}") % 2**31

    def entry(self, example: Example) -> dict:
        """The generator's entry (question, answer, metadata) of an example."""
        meta = example.meta
        key = (meta["dataset"], int(meta["seed"]), int(meta["index"]))
        if key not in self._entries:
            self._entries[key] = self._dataset(key[0], key[1])[key[2]]
        return self._entries[key]

    def _example(self, name: str, seed: int, index: int) -> Example:
        """Item `index` of the generator (dataset, seed) as an Example (made once: some
        generators take milliseconds an item, and a run asks for its splits repeatedly)."""
        key = (name, seed, index)
        if key in self._examples:
            return self._examples[key]
        entry = self._entries[key] = self._dataset(name, seed)[index]
        steps = WORKED_STEPS.get(name)
        thinking, answer = steps(entry, None, 0.0) if steps else ("", str(entry["answer"]))
        example = self._examples[key] = Example(
            id=f"{name}:{entry['question']}", prompt=str(entry["question"]),
            answer=str(entry["answer"]), solution=format_completion(thinking, answer),
            meta={"dataset": name, "seed": seed, "index": index})
        return example

    def generate(self, rng, difficulty):
        raise NotImplementedError("reasoning_gym draws problems by index: use "
                                  "examples(split, n, seed=...)")

    def examples(self, split: str, n: int, *, seed: int, unique: bool | None = None
                 ) -> list[Example]:
        """`n` problems of a split, the same list for the same (split, n, seed); the datasets
        take turns by smooth weighted round-robin (module docstring).

        Raises:
          ValueError: unknown split, n < 0, or a dataset with too few distinct problems of
            the split for `unique` (the message names it).
        """
        if split not in SPLITS:
            raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ValueError(f"n: expected >= 0, got {n}")
        unique = (split == "test") if unique is None else unique
        names, weights = list(self.weights), np.array(list(self.weights.values()))
        credit = np.zeros(len(names))
        order = []
        for _ in range(n):  # smooth weighted round-robin
            credit += weights
            pick = int(np.argmax(credit))
            credit[pick] -= weights.sum()
            order.append(names[pick])
        streams = {name: self._stream(name, split, seed, order.count(name), unique)
                   for name in names}
        return [next(streams[name]) for name in order]

    def _stream(self, name: str, split: str, seed: int, count: int, unique: bool):
        generator_seed = self._seed(name, split, seed)
        seen: set[str] = set()
        index, produced = -1, 0
        limit = ATTEMPTS_PER_PROBLEM * count + 1_000
        while produced < count:
            index += 1
            if index > limit:
                raise ValueError(
                    f"{name}: found only {produced} of {count} distinct {split} problems; ask "
                    f"for fewer or widen its settings (task.kwargs.dataset_kwargs.{name})")
            example = self._example(name, generator_seed, index)
            if split_of(example.id, self.test_fraction) != split:
                continue
            if not self._in_vocabulary(example):
                continue
            if unique:
                if example.id in seen:
                    continue
                seen.add(example.id)
            produced += 1
            yield example

    def _in_vocabulary(self, example: Example) -> bool:
        """Whether the problem's question and clean solution use the vocabulary's
        characters only (the default alphabet and `characters`)."""
        return set(example.prompt + example.solution) <= self._alphabet

    def _vocabulary(self) -> str:
        """The characters of a sample of problems and clean solutions, in both splits, that
        the character tokenizer's default alphabet lacks."""
        seen: set[str] = set()
        for name in self.weights:
            for split in SPLITS:
                seed = self._seed(name, split, 0)
                for index in range(VOCABULARY_SAMPLE):
                    example = self._example(name, seed, index)
                    seen.update(example.prompt, example.answer)
                    seen.update(self.solution(example, rng=index, error_rate=0.5)[0])
        for tag in ("<think>", "</think>", "<answer>", "</answer>"):
            seen.discard(tag)
        return "".join(sorted(seen - set(DEFAULT_ALPHABET)))

    # ---- worked solutions -----------------------------------------------------------------

    def solution(self, example: Example, *, rng, error_rate: float,
                 format_error_rate: float = 0.0) -> tuple[str, bool]:
        """A worked solution, its steps wrong w.p. `error_rate` each (module docstring).

        Returns:
          (completion text, whether the dataset's scorer gives it 1).
        """
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        entry = self.entry(example)
        steps = WORKED_STEPS.get(example.meta["dataset"])
        if steps is not None:
            thinking, answer = steps(entry, rng, error_rate)
        else:
            thinking, answer = "", str(entry["answer"])
            if rng.random() < error_rate:
                answer = _near_miss(answer, rng)
        return self.finish_solution(example, thinking, answer, rng, format_error_rate)

    # ---- scoring --------------------------------------------------------------------------

    def answer_score(self, completion: str, example: Example) -> float:
        """The dataset's `score_answer` of the completion's answer, in [0, 1]; 0 without an
        answer, and 0 (counted in reward_errors) when the scorer fails (module docstring)."""
        answer = self.extract_answer(completion)
        if answer is None:
            return 0.0
        name = example.meta["dataset"]
        dataset = self._dataset(name, int(example.meta["seed"]))
        entry = self.entry(example)
        score = guarded_call(f"reasoning_gym:{name}.score_answer",
                             lambda: dataset.score_answer(answer, entry), count=1,
                             budget_seconds=self.score_budget_seconds, batched=False)[0]
        return min(max(score, 0.0), 1.0)

    def is_correct(self, completion: str, example: Example) -> bool:
        """Whether the dataset's scorer gives the completion's answer 1."""
        return self.answer_score(completion, example) >= 1.0

    def accuracy_reward(self, completion: str, example: Example) -> float:
        """The dataset's score of the answer (partial credit where its scorer gives it)."""
        return self.answer_score(completion, example)
