"""Prompt data: JSONL loading with a schema check and grain pipelines with resumable state.

The RL and SFT loops read prompts from a `grain` pipeline built here:

        records -> per-host shard -> seeded shuffle (new order each epoch) -> repeat -> batch

`grain.MapDataset` is a lazy, random-access view, so the iterator's whole position is one
integer (`{"next_index": i}`): `iterator.get_state()` is JSON-serialisable and
`iterator.set_state(state)` on a freshly built iterator resumes at the same next batch.
The state is saved with the model checkpoint through grain's orbax handler
(`grain.checkpoint.CheckpointSave` / `CheckpointRestore`, one JSON file per process); the
helpers `save_iterator` / `restore_iterator` do the same outside a `CheckpointManager`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain

from grpo_jax.json_files import json_nesting, reject_non_finite

__all__ = [
    "jsonl_to_examples",
    "load_jsonl",
    "prompt_dataset",
    "prompt_iterator",
    "records_to_examples",
    "restore_iterator",
    "save_iterator",
]

# Types accepted in a schema, and the names used in error messages.
_TYPE_NAMES = {str: "str", int: "int", float: "float", bool: "bool", list: "list", dict: "dict"}


def _type_name(expected) -> str:
    if isinstance(expected, tuple):
        return " or ".join(_type_name(t) for t in expected)
    return _TYPE_NAMES.get(expected, getattr(expected, "__name__", str(expected)))


def _matches(value: Any, expected) -> bool:
    """JSON-aware isinstance: bool is not an int, an int is a valid float."""
    types = expected if isinstance(expected, tuple) else (expected,)
    for t in types:
        if t is None or t is type(None):
            if value is None:
                return True
        elif t is bool:
            if isinstance(value, bool):
                return True
        elif t is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif t is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif isinstance(value, t):
            return True
    return False


def load_jsonl(
    path: str | os.PathLike,
    *,
    schema: Mapping[str, type | tuple[type, ...]] | None = None,
    required: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Reads a JSON-lines file, one object per non-blank line, checked against a schema.

    Args:
        path: the file (UTF-8).
        schema: field name -> expected type (or tuple of types). `int` rejects booleans,
            `float` accepts integers. A field in the schema that is present must match it;
            fields not in the schema pass through unchecked.
        required: fields every row must have; defaults to every field of `schema`.

    Returns:
        list of row dicts, in file order.

    Raises:
        ValueError: `<path>:<line>: ...` naming the field (missing / wrong type / not a
            finite number), the JSON error, bytes that are not UTF-8, NaN / Infinity or an
            integer too long to convert, for the first bad row; `<path>: no rows` for a file
            without any.
    """
    schema = dict(schema or {})
    required = tuple(schema) if required is None else tuple(required)
    path = os.fspath(path)
    rows = []
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{line_number}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_constant=reject_non_finite)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{line_number}: invalid JSON ({e.msg} at column {e.colno})"
                ) from None
            except ValueError as e:  # NaN / Infinity, or an int too long to convert
                raise ValueError(f"{path}:{line_number}: {str(e).splitlines()[0]}") from None
            except RecursionError:
                raise ValueError(f"{path}:{line_number}: {json_nesting(line)[1]}") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}"
                )
            for field in required:
                if field not in row:
                    raise ValueError(f"{path}:{line_number}: missing required field {field!r}")
            for field, expected in schema.items():
                if field in row and not _matches(row[field], expected):
                    raise ValueError(
                        f"{path}:{line_number}: field {field!r} must be "
                        f"{_type_name(expected)}, "
                        f"got {type(row[field]).__name__} {row[field]!r:.40}"
                    )
                if isinstance(row.get(field), float) and not math.isfinite(row[field]):
                    raise ValueError(f"{path}:{line_number}: field {field!r} must be a finite "
                                     f"number, got {row[field]!r}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows (the file is empty); expected one JSON object per "
                         "line")
    return rows


def _example_cls():
    # Imported lazily: grpo_jax.tasks.base is owned by the task module.
    from grpo_jax.tasks.base import Example  # pylint: disable=import-outside-toplevel

    return Example


def records_to_examples(
    records: Sequence[Mapping[str, Any]],
    *,
    prompt_field: str = "question",
    answer_field: str = "answer",
    solution_field: str | None = None,
    difficulty_field: str | None = None,
    id_field: str | None = None,
    id_prefix: str = "row",
    answer_fn: Callable[[Any], str] | None = None,
    source: str = "records",
) -> list:
    """Maps dict records to `Example`s; the remaining fields go to `Example.meta`.

    Args:
        records: row dicts (e.g. from `load_jsonl`).
        prompt_field / answer_field / solution_field / difficulty_field / id_field: the row
            fields for Example.prompt / answer / solution / difficulty / id (None: not read;
            solution None, difficulty the Example default, id f"{id_prefix}-{index}").
        id_prefix: prefix of generated ids.
        answer_fn: maps the raw answer field to the reference answer string (default `str`).
        source: names the records in error messages (e.g. the file path).

    Returns:
        list of Examples, one per record.
    """
    example_cls = _example_cls()
    answer_fn = answer_fn or str
    mapped = (prompt_field, answer_field, solution_field, difficulty_field, id_field)
    used = {field for field in mapped if field}
    examples = []
    for index, row in enumerate(records):
        for field in (prompt_field, answer_field):
            if field not in row:
                raise ValueError(f"{source} row {index}: missing field {field!r}")
        try:
            answer = answer_fn(row[answer_field])
        except ValueError as e:
            raise ValueError(f"{source} row {index}: field {answer_field!r}: {e}") from None
        difficulty = None
        if difficulty_field is not None and row.get(difficulty_field) is not None:
            difficulty = row[difficulty_field]
            if not _matches(difficulty, int):
                raise ValueError(
                    f"{source} row {index}: field {difficulty_field!r} must be int, "
                    f"got {type(difficulty).__name__}"
                )
        if id_field is not None and id_field in row:
            example_id = str(row[id_field])
        else:
            example_id = f"{id_prefix}-{index}"
        optional = {} if difficulty is None else {"difficulty": int(difficulty)}
        examples.append(
            example_cls(
                id=example_id,
                prompt=str(row[prompt_field]),
                answer=answer,
                solution=(
                    None
                    if solution_field is None or row.get(solution_field) is None
                    else str(row[solution_field])
                ),
                meta={k: v for k, v in row.items() if k not in used},
                **optional,
            )
        )
    return examples


def jsonl_to_examples(
    path: str | os.PathLike,
    *,
    prompt_field: str = "question",
    answer_field: str = "answer",
    solution_field: str | None = None,
    difficulty_field: str | None = None,
    id_field: str | None = None,
    answer_fn: Callable[[Any], str] | None = None,
) -> list:
    """Loads a JSONL file of problems as `Example`s, with a schema check on the mapped fields.

    Prompt must be a string; answer a string or number; solution a string; difficulty an
    int; id a string or int. Solution / difficulty / id may be absent from a row.

    Args:
        path: the JSONL file.
        prompt_field ... id_field, answer_fn: as in `records_to_examples`.

    Returns:
        list of Examples (id defaults to f"{file stem}-{line index}").

    Raises:
        ValueError: naming the file, line and field of the first bad row.
    """
    schema: dict[str, Any] = {prompt_field: str, answer_field: (str, int, float)}
    if solution_field:
        schema[solution_field] = (str, type(None))
    if difficulty_field:
        schema[difficulty_field] = (int, type(None))
    if id_field:
        schema[id_field] = (str, int)
    rows = load_jsonl(path, schema=schema, required=(prompt_field, answer_field))
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return records_to_examples(
        rows,
        prompt_field=prompt_field,
        answer_field=answer_field,
        solution_field=solution_field,
        difficulty_field=difficulty_field,
        id_field=id_field,
        id_prefix=stem,
        answer_fn=answer_fn,
        source=os.fspath(path),
    )


def _process_index_and_count(shard_index, shard_count) -> tuple[int, int]:
    if shard_index is None or shard_count is None:
        import jax  # pylint: disable=import-outside-toplevel

        shard_index = jax.process_index() if shard_index is None else shard_index
        shard_count = jax.process_count() if shard_count is None else shard_count
    if not (isinstance(shard_count, int) and shard_count >= 1):
        raise ValueError(f"shard_count must be an int >= 1, got {shard_count!r}")
    if not (isinstance(shard_index, int) and 0 <= shard_index < shard_count):
        raise ValueError(f"shard_index must be an int in [0, {shard_count}), got {shard_index!r}")
    return shard_index, shard_count


def prompt_dataset(
    records: Sequence[Any],
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    drop_remainder: bool = True,
    batch_fn: Callable[[Sequence[Any]], Any] = list,
) -> grain.MapDataset:
    """A lazy grain pipeline: shard -> seeded shuffle (reshuffled each epoch) -> repeat -> batch.

    Each host takes the strided shard `records[shard_index::shard_count]`, truncated so all
    shards have `len(records) // shard_count` records (hosts then step in lock-step). The
    shuffle is a permutation of the host's shard that is a pure function of
    (seed, epoch); batches may straddle epoch boundaries.

    Args:
        records: random-access sequence of records (dicts, Examples, ...), len N.
        batch_size: records per batch on this host.
        seed: shuffle seed.
        shuffle: False keeps the shard order.
        num_epochs: passes over the data; None repeats forever.
        shard_index, shard_count: this host's shard; default `jax.process_index()` /
            `jax.process_count()`.
        drop_remainder: drop a last, short batch (only possible when num_epochs is finite).
        batch_fn: builds a batch from a list of records (default: the list itself).

    Returns:
        grain.MapDataset of batches.
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if num_epochs is not None and not (isinstance(num_epochs, int) and num_epochs >= 1):
        raise ValueError(f"num_epochs must be None or an int >= 1, got {num_epochs!r}")
    shard_index, shard_count = _process_index_and_count(shard_index, shard_count)
    per_shard = len(records) // shard_count
    if per_shard == 0:
        raise ValueError(
            f"records: {len(records)} records cannot fill {shard_count} shards (need >= 1 each)"
        )
    dataset = grain.MapDataset.source(records)
    dataset = dataset[shard_index : per_shard * shard_count : shard_count]
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    dataset = dataset.repeat(num_epochs)  # reseeds the shuffle every epoch
    return dataset.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)


def prompt_iterator(
    records: Sequence[Any],
    *,
    batch_size: int,
    seed: int,
    state: Mapping[str, Any] | None = None,
    **kwargs,
) -> grain.DatasetIterator:
    """A checkpointable iterator over `prompt_dataset(records, ...)` batches.

    `it.get_state()` returns a JSON-serialisable dict; `prompt_iterator(..., state=s)` (or
    `it.set_state(s)`) on an iterator built with the same arguments yields the same next
    batch as the saved one would have.

    Args:
        records, batch_size, seed, **kwargs: as in `prompt_dataset`.
        state: optional saved state to resume from.

    Returns:
        grain.DatasetIterator of batches.
    """
    dataset = prompt_dataset(records, batch_size=batch_size, seed=seed, **kwargs)
    # Batches of Python objects are cheap to build: no worker threads, no prefetch, so the
    # iterator state is exactly the number of batches consumed.
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    iterator = iter(dataset.to_iter_dataset(read_options))
    if state is not None:
        iterator.set_state(dict(state))
    return iterator


def save_iterator(directory: str | os.PathLike, iterator: grain.DatasetIterator) -> None:
    """Saves iterator state as `directory/process_<i>-of-<n>.json` via grain's orbax handler.

    Args:
        directory: an existing or new directory.
        iterator: a grain DatasetIterator (e.g. from `prompt_iterator`).
    """
    from etils import epath  # pylint: disable=import-outside-toplevel

    path = epath.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    grain.checkpoint.CheckpointHandler().save(path, item=iterator)


def restore_iterator(
    directory: str | os.PathLike, iterator: grain.DatasetIterator
) -> grain.DatasetIterator:
    """Restores state written by `save_iterator` (or an orbax `CheckpointSave`) in place.

    Args:
        directory: the directory passed to `save_iterator`.
        iterator: an iterator built with the same pipeline arguments.

    Returns:
        the same iterator, positioned at the saved next batch.
    """
    from etils import epath  # pylint: disable=import-outside-toplevel

    return grain.checkpoint.CheckpointHandler().restore(epath.Path(directory), item=iterator)
