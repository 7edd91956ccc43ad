"""A researcher's own problems from a JSONL, CSV or Parquet file, as the task "file".

Each row holds a prompt and a reference answer under field names the config maps
(`prompt_field`, `answer_field`; an optional `solution_field` holds a worked solution).
Every row is read and checked when the task is built, so a bad row stops a run before any
work with one line naming the file, the row and the field:

    data.jsonl: row 7: field 'answer': expected a non-empty string, got list [1, 2]

Row numbers are the file's line numbers for JSONL and CSV (the header is CSV's row 1, as in
a spreadsheet) and 1-based row indices for Parquet. A relative `path` is resolved from the
current folder.

The held-out split is a stable hash of the row's prompt (`base.split_of`; surrounding spaces
stripped): a row is held out iff the hash falls in the first `test_fraction` of the range, so
the split is the same on every machine, does not depend on the row order, and rows that
share a prompt fall on the same side. The "test" split is the held-out rows in file order
(the same problems for every seed); "train" is the other rows in a seeded order, repeated in
new orders when more are asked for than the file holds.

Answers are compared by `compare` (COMPARISONS): "text" (default) as numbers when both parse
as numbers, else as normalised text (case, runs of spaces, "$" and a final period ignored);
"exact" as the stripped strings; "math" as "text" or else equal under math-verify (LaTeX and
expressions; plain words are never given to it, `rewards.accuracy.answers_match`, but an
answer that is text with a symbol in it can still compare as an expression, hence not the
default). An integer answer in JSONL or Parquet is read as its decimal text. Without a worked solution, pretraining reads question -> answer pairs
(`<think></think><answer>A</answer>`) whose answer is wrong with
`task.solution_error_rate` (`Task.solution`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Any

import numpy as np

from grpo_jax.json_files import json_nesting, reject_non_finite
from grpo_jax.rewards.accuracy import answers_match
from grpo_jax.tasks.base import Example, Task, split_of, stable_hash
from grpo_jax.tasks.registry import register_task

__all__ = ["COMPARISONS", "FORMATS", "FileTask", "read_rows"]

# File name endings and their readers' names.
FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}

# How an extracted answer is compared with the reference (FileTask's `compare`).
COMPARISONS = ("text", "exact", "math")

# Keywords a Python reward receives beside the row's other fields (`rewards.python`): a
# column of one of these names is left out of Example.meta.
_RESERVED = ("id", "difficulty", "prompt", "completion", "answer", "prompts", "completions",
             "answers")

# The characters of a CharTokenizer's default alphabet (`text.char.DEFAULT_ALPHABET`);
# tasks do not import text/, so the file's other characters are declared as `characters`.
_DEFAULT_ALPHABET = set(
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n"
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _describe(value: Any) -> str:
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def _jsonl_rows(path: str):
    """(line number, row dict) of a JSONL file; ValueError naming the row."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM first
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: row {number}: not UTF-8 (byte 0x{raw[e.start]:02x} "
                                 f"at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_constant=reject_non_finite)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: row {number}: invalid JSON ({e.msg} at column "
                                 f"{e.colno})") from None
            except ValueError as e:  # NaN / Infinity, or an integer too long to convert
                raise ValueError(f"{path}: row {number}: {str(e).splitlines()[0]}") from None
            except RecursionError:
                raise ValueError(f"{path}: row {number}: {json_nesting(line)[1]}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: row {number}: expected a JSON object, got "
                                 f"{type(row).__name__}")
            yield number, row


def _csv_rows(path: str):
    """(row number, row dict) of a CSV file with a header row (row 1)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        row = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}: row {row}: not UTF-8 (byte 0x{data[e.start]:02x})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    start = 1
    try:
        header = next(reader, None)
        if header is None:
            return
        start = reader.line_num + 1
        for values in reader:
            if values:  # else a blank line
                if len(values) != len(header):
                    raise ValueError(f"{path}: row {start}: {len(values)} values for the "
                                     f"{len(header)} columns of the header")
                yield start, dict(zip(header, values))
            start = reader.line_num + 1
    except csv.Error as e:
        raise ValueError(f"{path}: row {start}: {e}") from None


def _parquet_rows(path: str):
    """(1-based row index, row dict) of a Parquet file (pyarrow, the `parquet` extra)."""
    try:
        import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ValueError(f"path: {path} is a Parquet file, which needs pyarrow: pip install "
                         "'grpo_jax[parquet]'") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001  pyarrow raises several types for a bad file
        message = " ".join(str(e).split())[:120]
        raise ValueError(f"{path}: not a readable Parquet file ({message})") from None
    yield from enumerate(rows, start=1)


def read_rows(path: str) -> list[tuple[int, dict]]:
    """The rows of a JSONL, CSV or Parquet file as (row number, dict), chosen by its ending.

    Raises:
      ValueError: "path: ..." for a file type other than FORMATS' or a missing file;
        "<path>: row N: ..." for a row that does not read; "<path>: no rows" for none.
    """
    kind = FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise ValueError(f"path: expected a file ending in {', '.join(FORMATS)}, got "
                         f"{os.path.basename(path)!r}")
    if not os.path.isfile(path):
        raise ValueError(f"path: no such file {path!r} (a relative path is read from the "
                         "current folder)")
    reader = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[kind]
    rows = list(reader(path))
    if not rows:
        raise ValueError(f"path: {path} has no rows")
    return rows


def _text_field(path, number, row, field, *, what) -> str | None:
    """The row's `field` as a non-empty string (an integer as its decimal text)."""
    if field not in row:
        raise ValueError(f"{path}: row {number}: missing field {field!r} (the row has "
                         f"{', '.join(map(repr, row)) or 'no fields'}; task.kwargs.{what} "
                         "names it)")
    value = row[field]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        hint = f" (write it as text: \"{value}\")" if isinstance(value, float) else ""
        raise ValueError(f"{path}: row {number}: field {field!r}: expected a non-empty string, "
                         f"got {_describe(value)}{hint}")
    return value


def _meta_value(value):
    """A JSON-friendly value of a column (Parquet dates, bytes, ... as their text)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_meta_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _meta_value(v) for k, v in value.items()}
    return str(value)


@register_task("file")
class FileTask(Task):
    """Prompts and reference answers read from a JSONL, CSV or Parquet file.

    Args:
      path: the file (ending .jsonl, .csv or .parquet); relative to the current folder.
      prompt_field: the field of a row holding the question (a non-empty string).
      answer_field: the field holding the reference answer (a non-empty string; an integer
        is read as its decimal text).
      solution_field: the field holding a worked solution, used as the thinking of
        pretraining and SFT completions; "" (default) for none. A row may leave it empty.
      test_fraction: the share of rows held out (by a stable hash of the prompt), in [0, 1).
      compare: how the "accuracy" reward compares an answer with the reference: "text",
        "exact" or "math" (COMPARISONS; see the module docstring).

    Rows keep their other fields in `Example.meta`, which a Python reward receives as
    keywords (except fields named like the reward's own arguments: id, difficulty, prompt,
    completion, answer and their plurals).
    """

    def __init__(self, path: str = "", prompt_field: str = "prompt",
                 answer_field: str = "answer", solution_field: str = "",
                 test_fraction: float = 0.1, compare: str = "text"):
        super().__init__(difficulty=1)
        for name, value in (("path", path), ("prompt_field", prompt_field),
                            ("answer_field", answer_field)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
        if not isinstance(solution_field, str):
            raise ValueError(f"solution_field: expected a string, got {solution_field!r}")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) \
                or not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction: expected a fraction in [0, 1), got "
                             f"{test_fraction!r}")
        if compare not in COMPARISONS:
            raise ValueError(f"compare: expected one of {COMPARISONS}, got {compare!r}")
        self.compare = compare
        path = os.path.expanduser(path)
        self.path = os.path.abspath(path)
        self.test_fraction = float(test_fraction)
        stem = os.path.splitext(os.path.basename(self.path))[0]
        self._rows = {"train": [], "test": []}
        characters: set[str] = set()
        for number, row in read_rows(path):
            prompt = _text_field(path, number, row, prompt_field, what="prompt_field")
            answer = _text_field(path, number, row, answer_field, what="answer_field")
            solution = row.get(solution_field) if solution_field else None
            if solution is not None and not isinstance(solution, str):
                raise ValueError(f"{path}: row {number}: field {solution_field!r}: "
                                 f"expected a string, got {_describe(solution)}")
            used = {prompt_field, answer_field, solution_field, *_RESERVED}
            example = Example(
                id=f"{stem}:{number}", prompt=prompt.strip(), answer=answer.strip(),
                solution=solution or None,
                meta={"row": number, **{k: _meta_value(v) for k, v in row.items()
                                        if k not in used}})
            characters.update(prompt, answer, solution or "")
            self._rows[split_of(example.prompt, self.test_fraction)].append(example)
        self.characters = "".join(sorted(characters - _DEFAULT_ALPHABET))

    @property
    def num_rows(self) -> dict[str, int]:
        """Rows per split: {"train": ..., "test": ...}."""
        return {split: len(rows) for split, rows in self._rows.items()}

    def check_answer(self, answer: str, example: Example) -> bool:
        """Whether an extracted answer equals the reference under `compare`."""
        if self.compare == "exact":
            return answer.strip() == example.answer
        return answers_match(answer, example.answer, symbolic=self.compare == "math")

    def generate(self, rng, difficulty):
        raise NotImplementedError("the file task reads its rows: use examples(split, n, seed)")

    def examples(self, split: str, n: int, *, seed: int, unique: bool | None = None) -> list:
        """`n` rows of a split: "test" the first `n` held-out rows in file order, "train" the
        training rows in a seeded order (a new order for each pass when `n` exceeds them).

        Raises:
          ValueError: unknown split; `n` more held-out rows than the file has (or, with
            `unique`, more training rows), naming the counts.
        """
        if split not in self._rows:
            raise ValueError(f"split: expected one of {tuple(self._rows)}, got {split!r}")
        if n < 0:
            raise ValueError(f"n: expected >= 0, got {n}")
        rows = self._rows[split]
        unique = (split == "test") if unique is None else unique
        if n > len(rows) and (unique or not rows):
            what = "held-out" if split == "test" else "training"
            raise ValueError(
                f"{n} {what} problems asked for, {os.path.basename(self.path)} has "
                f"{len(rows)} (test_fraction {self.test_fraction} of "
                f"{sum(self.num_rows.values())} rows); expected at most {len(rows)}")
        if split == "test":
            return list(rows[:n])
        rng = np.random.default_rng([int(seed), stable_hash(self.name) % 2**32])
        out: list[Example] = []
        while len(out) < n:
            out += [rows[i] for i in rng.permutation(len(rows))[:n - len(out)]]
        return out
