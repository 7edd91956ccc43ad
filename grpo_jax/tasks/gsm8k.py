"""GSM8K (Cobbe et al., 2021, https://arxiv.org/abs/2110.14168) as `Example`s.

Two offline sources, both giving the same Examples:

* TFDS `data_source` over the `gsm8k` builder prepared in array_record format (random
  access, no TensorFlow needed): `load_gsm8k(split, data_dir=...)`;
* the original JSONL files of github.com/openai/grade-school-math (rows
  `{"question": ..., "answer": "<worked solution>\\n#### <final number>"}`):
  `load_gsm8k_jsonl(path)`.

Example fields: prompt = the question; answer = the final number after "####" with
thousands separators removed ("1,200" -> "1200"); solution = the worked solution before
"####" with the calculator annotations `<<48/2=24>>` removed; difficulty = the number of
solution lines (the reasoning steps, 2 to 8 in GSM8K); meta = split, index, raw answer.

Preparing the array_record files needs no TensorFlow either. With network:
`tfds build gsm8k --file_format=array_record --data_dir=DIR`. Without network, from local
copies of the JSONL files: `prepare_gsm8k(DIR, jsonl_dir=...)`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "GSM8KTask",
    "GSM8K_SPLITS",
    "GSM8KNotPreparedError",
    "extract_gsm8k_answer",
    "gsm8k_example",
    "load_gsm8k",
    "load_gsm8k_jsonl",
    "prepare_gsm8k",
    "split_gsm8k_answer",
]

GSM8K_SPLITS = ("train", "test", "train_socratic", "test_socratic")

_CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")
_NUMBER = re.compile(r"^-?[\d,]*\.?\d+$")


class GSM8KNotPreparedError(FileNotFoundError):
    """GSM8K is not prepared in array_record format in the TFDS data directory."""


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def split_gsm8k_answer(answer_text: str) -> tuple[str, str]:
    """Splits a GSM8K answer into (worked solution, final number).

    Args:
      answer_text: "<solution lines>\\n#### <number>".

    Returns:
      (solution text as written, final number with "," removed).

    Raises:
      ValueError: when there is no "####" line or what follows is not a number.
    """
    if "####" not in answer_text:
        raise ValueError("answer has no '#### <number>' final line")
    solution, final = answer_text.rsplit("####", 1)
    final = final.strip().replace(",", "")
    final = final.removeprefix("$")
    if not _NUMBER.match(final):
        raise ValueError(f"answer after '####' is not a number: {final!r:.40}")
    return solution.strip(), final


def extract_gsm8k_answer(answer_text: str) -> str:
    """The final number after "####" in a GSM8K answer, without thousands separators.

    Args:
      answer_text: the GSM8K `answer` field.

    Returns:
      the number as a string, e.g. "1200".
    """
    return split_gsm8k_answer(answer_text)[1]


def gsm8k_example(record: Mapping[str, Any], *, split: str, index: int):
    """Maps one GSM8K row (JSONL dict or TFDS record, str or bytes values) to an Example.

    Args:
      record: has "question" and "answer".
      split: split name, used in the id ("gsm8k-<split>-<index>") and meta.
      index: row index in the split.

    Returns:
      Example.

    Raises:
      ValueError: naming the split and row when a field is missing or malformed.
    """
    from grpo_jax.tasks.base import Example  # pylint: disable=import-outside-toplevel

    for field in ("question", "answer"):
        if field not in record:
            raise ValueError(f"gsm8k {split} row {index}: missing field {field!r}")
    raw_answer = _text(record["answer"])
    try:
        solution, final = split_gsm8k_answer(raw_answer)
    except ValueError as e:
        raise ValueError(f"gsm8k {split} row {index}: field 'answer': {e}") from None
    solution = _CALCULATOR_ANNOTATION.sub("", solution)
    steps = [line for line in solution.splitlines() if line.strip()]
    return Example(
        id=f"gsm8k-{split}-{index}",
        prompt=_text(record["question"]).strip(),
        answer=final,
        solution=solution,
        difficulty=len(steps),
        meta={"source": "gsm8k", "split": split, "index": index, "raw_answer": raw_answer},
    )


def load_gsm8k_jsonl(path: str | os.PathLike, *, split: str | None = None) -> list:
    """Loads a GSM8K JSONL file ({"question": str, "answer": str} per line) as Examples.

    Args:
      path: e.g. grade-school-math/grade_school_math/data/test.jsonl.
      split: name for ids and meta; default the file stem.

    Returns:
      list of Examples in file order.

    Raises:
      ValueError: `<path>:<line>: ...` for a bad row.
    """
    from grpo_jax.tasks.data import load_jsonl  # pylint: disable=import-outside-toplevel

    path = os.fspath(path)
    split = split or os.path.splitext(os.path.basename(path))[0]
    rows = load_jsonl(path, schema={"question": str, "answer": str})
    examples = []
    for index, row in enumerate(rows):
        try:
            examples.append(gsm8k_example(row, split=split, index=index))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return examples


def _import_builder():
    # Importing the module registers the `gsm8k` builder; `import tensorflow_datasets`
    # alone does not register it when TensorFlow is absent.
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    from tensorflow_datasets.text.gsm8k import gsm8k  # pylint: disable=import-outside-toplevel

    return tfds, gsm8k


def _resolve_data_dir(data_dir) -> str:
    if data_dir is not None:
        return os.fspath(data_dir)
    from tensorflow_datasets.core import constants  # pylint: disable=import-outside-toplevel

    return os.environ.get("TFDS_DATA_DIR", constants.DATA_DIR)


def _how_to_prepare(data_dir: str) -> str:
    return (
        f"GSM8K is not prepared in array_record format under {data_dir!r} (tfds 'gsm8k'); "
        f"prepare it with `tfds build gsm8k --file_format=array_record --data_dir={data_dir}` "
        "on a machine with network (no TensorFlow needed), or offline from local copies of "
        "openai/grade-school-math's JSONL files with "
        f"`grpo_jax.tasks.gsm8k.prepare_gsm8k({data_dir!r}, jsonl_dir=...)`, or load a JSONL "
        "file directly with `grpo_jax.tasks.gsm8k.load_gsm8k_jsonl(path)`"
    )


def _is_prepared(data_dir: str) -> bool:
    root = os.path.join(data_dir, "gsm8k")
    if not os.path.isdir(root):
        return False
    for version in os.listdir(root):
        files = os.listdir(os.path.join(root, version)) if version[:1].isdigit() else []
        if "dataset_info.json" in files and any(".array_record" in f for f in files):
            return True
    return False


def load_gsm8k(split: str = "train", *, data_dir: str | os.PathLike | None = None) -> list:
    """Loads GSM8K from a prepared TFDS array_record `data_source`, offline.

    Args:
      split: "train", "test", "train_socratic" or "test_socratic", with an optional TFDS
        slice ("test[:100]").
      data_dir: TFDS data directory; default $TFDS_DATA_DIR or ~/tensorflow_datasets.

    Returns:
      list of Examples in the data source's order.

    Raises:
      GSM8KNotPreparedError: the dataset is not prepared there; the message says how to
        prepare it.
      ValueError: unknown split, or a malformed row (naming the row).
    """
    base_split = split.split("[", 1)[0]
    if base_split not in GSM8K_SPLITS:
        raise ValueError(f"split: unknown GSM8K split {split!r}, expected one of {GSM8K_SPLITS}")
    tfds, _ = _import_builder()
    resolved_dir = _resolve_data_dir(data_dir)
    try:
        source = tfds.data_source(
            "gsm8k", split=split, data_dir=resolved_dir, download=False, try_gcs=False
        )
    except Exception as e:  # tfds raises several types for a missing dataset
        if not _is_prepared(resolved_dir):
            raise GSM8KNotPreparedError(_how_to_prepare(resolved_dir)) from e
        raise
    return [gsm8k_example(source[i], split=base_split, index=i) for i in range(len(source))]


def prepare_gsm8k(
    data_dir: str | os.PathLike,
    *,
    jsonl_dir: str | os.PathLike | None = None,
    splits: Sequence[str] | None = None,
) -> str:
    """Builds the TFDS `gsm8k` dataset in array_record format, without TensorFlow.

    Args:
      data_dir: TFDS data directory to write to.
      jsonl_dir: a directory with the original `<split>.jsonl` files (offline build);
        None downloads them (needs network).
      splits: the splits to build from `jsonl_dir`; default those whose file exists.

    Returns:
      the prepared dataset directory (data_dir/gsm8k/<version>).

    Raises:
      FileNotFoundError: `jsonl_dir` holds none of the requested split files.
    """
    tfds, gsm8k = _import_builder()
    data_dir = os.fspath(data_dir)
    if jsonl_dir is None:
        builder = tfds.builder("gsm8k", data_dir=data_dir)
    else:
        jsonl_dir = os.fspath(jsonl_dir)
        wanted = tuple(splits) if splits is not None else GSM8K_SPLITS
        paths = {s: os.path.join(jsonl_dir, f"{s}.jsonl") for s in wanted}
        paths = {s: p for s, p in paths.items() if os.path.exists(p)}
        if not paths or (splits is not None and len(paths) != len(wanted)):
            raise FileNotFoundError(
                f"jsonl_dir: expected {', '.join(f'{s}.jsonl' for s in wanted)} in {jsonl_dir!r}"
            )

        class _LocalGsm8k(gsm8k.Gsm8k, skip_registration=True):
            """The registered builder, reading local JSONL files instead of downloading."""

            name = "gsm8k"

            def _split_generators(self, dl_manager):
                del dl_manager
                return {s: self._generate_examples(p) for s, p in paths.items()}

        builder = _LocalGsm8k(data_dir=data_dir)
    download_config = tfds.download.DownloadConfig(try_download_gcs=False)
    builder.download_and_prepare(file_format="array_record", download_config=download_config)
    return os.fspath(builder.data_dir)


# ---------------------------------------------------------------------------------------------
# The registered task.

from grpo_jax.tasks.base import Task, stable_hash  # noqa: E402
from grpo_jax.tasks.registry import register_task  # noqa: E402

JSONL_FILES = {"train": "train.jsonl", "test": "test.jsonl"}


def _how_to_provide(data_dir: str) -> str:
    return (
        "data_dir: expected a directory with GSM8K's train.jsonl and test.jsonl (the "
        "github.com/openai/grade-school-math release format) or a TFDS data directory with "
        "gsm8k prepared in array_record format, got "
        f"{data_dir!r}; see README 'GSM8K offline' for how to prepare either"
    )


@register_task("gsm8k")
class GSM8KTask(Task):
    """GSM8K grade-school word problems, read offline from `data_dir`.

    `data_dir` is either a directory with `train.jsonl` / `test.jsonl` (release format) or a
    prepared TFDS data directory (`prepare_gsm8k` / `tfds build gsm8k
    --file_format=array_record`). The "train" split samples `n` problems in a seeded random
    order; "test" is the first `n` problems of the test file in file order, so every seed
    is evaluated on the same problems.

    Rewards: "accuracy" (strict: the answer inside <answer> </answer> equals the final
    number), "accuracy_lenient" (the last number anywhere in the completion does), and the
    format rewards. Evaluations report both accuracies.
    """

    test_fraction = 0.0  # the splits are the dataset's own

    def __init__(self, data_dir: str = ""):
        super().__init__(difficulty=1)
        data_dir = os.fspath(data_dir) if data_dir else ""
        if not data_dir or not os.path.isdir(data_dir):
            raise ValueError(_how_to_provide(data_dir))
        files = {split: os.path.join(data_dir, name) for split, name in JSONL_FILES.items()}
        if all(os.path.isfile(f) for f in files.values()):
            self._source = ("jsonl", files)
        elif _is_prepared(data_dir):
            self._source = ("tfds", data_dir)
        else:
            raise ValueError(_how_to_provide(data_dir))
        self.data_dir = data_dir
        self._rows: dict[str, list] = {}

    def rows(self, split: str) -> list:
        """Every problem of the split ("train" or "test"), in the dataset's order."""
        if split not in JSONL_FILES:
            raise ValueError(f"split: expected one of {tuple(JSONL_FILES)}, got {split!r}")
        if split not in self._rows:
            kind, where = self._source
            if kind == "jsonl":
                self._rows[split] = load_gsm8k_jsonl(where[split], split=split)
            else:
                self._rows[split] = load_gsm8k(split, data_dir=where)
        return self._rows[split]

    def generate(self, rng, difficulty):
        raise NotImplementedError("gsm8k is a fixed dataset: use examples(split, n, seed)")

    def examples(self, split: str, n: int, *, seed: int, unique: bool | None = None) -> list:
        """`n` problems of a split: "train" in a seeded random order, "test" in file order.

        Raises:
          ValueError: the split has fewer than `n` problems (the message gives the count).
        """
        del unique  # a dataset's problems are distinct
        rows = self.rows(split)
        if not 0 <= n <= len(rows):
            raise ValueError(f"gsm8k {split}: asked for {n} problems but {self.data_dir!r} "
                             f"has {len(rows)}")
        if split == "test":
            return list(rows[:n])
        order = np.random.default_rng([int(seed), stable_hash(self.name) % 2**32]).permutation(
            len(rows))
        return [rows[i] for i in order[:n]]

    def reward_fns(self):
        from grpo_jax.rewards.accuracy import lenient_accuracy_reward

        return {**super().reward_fns(), "accuracy_lenient": lenient_accuracy_reward}
