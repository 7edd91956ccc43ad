"""JSONL schema checks and grain prompt pipelines (seeded shuffle, sharding, resumable state)."""

import json

import grain
import orbax.checkpoint as ocp
import pytest

from grpo_jax.tasks import data


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------- JSONL


def test_load_jsonl_reads_rows_and_skips_blank_lines(tmp_path):
    path = _write(
        tmp_path / "p.jsonl",
        [
            '{"question": "1+1?", "answer": "2", "extra": [1]}',
            "",
            '{"question": "q", "answer": "a"}',
        ],
    )
    rows = data.load_jsonl(path, schema={"question": str, "answer": str})
    assert rows == [
        {"question": "1+1?", "answer": "2", "extra": [1]},
        {"question": "q", "answer": "a"},
    ]


def test_load_jsonl_missing_field_names_line_and_field(tmp_path):
    path = _write(tmp_path / "p.jsonl", ['{"question": "a", "answer": "1"}', '{"question": "b"}'])
    with pytest.raises(ValueError, match=r"p\.jsonl:2: missing required field 'answer'"):
        data.load_jsonl(path, schema={"question": str, "answer": str})


def test_load_jsonl_mistyped_field_names_line_and_field(tmp_path):
    path = _write(
        tmp_path / "p.jsonl",
        ['{"question": "a", "answer": "1"}', "", '{"question": "b", "answer": 3}'],
    )
    with pytest.raises(ValueError, match=r"p\.jsonl:3: field 'answer' must be str, got int"):
        data.load_jsonl(path, schema={"question": str, "answer": str})


def test_load_jsonl_bool_is_not_int_but_int_is_float(tmp_path):
    path = _write(tmp_path / "p.jsonl", ['{"level": 2, "score": 1}', '{"level": true, "score": 1}'])
    with pytest.raises(ValueError, match=r":2: field 'level' must be int, got bool"):
        data.load_jsonl(path, schema={"level": int, "score": float})
    rows = data.load_jsonl(path, schema={"score": float})
    assert [r["score"] for r in rows] == [1, 1]


def test_load_jsonl_optional_fields(tmp_path):
    path = _write(tmp_path / "p.jsonl", ['{"q": "a"}', '{"q": "b", "level": "hard"}'])
    with pytest.raises(ValueError, match=r":2: field 'level' must be int"):
        data.load_jsonl(path, schema={"q": str, "level": int}, required=("q",))
    assert len(data.load_jsonl(path, schema={"q": str, "level": str}, required=("q",))) == 2


def test_load_jsonl_invalid_json_names_line(tmp_path):
    path = _write(tmp_path / "p.jsonl", ['{"q": "a"}', '{"q": "b",}'])
    with pytest.raises(ValueError, match=r"p\.jsonl:2: invalid JSON"):
        data.load_jsonl(path)
    path = _write(tmp_path / "l.jsonl", ["[1, 2]"])
    with pytest.raises(ValueError, match=r"l\.jsonl:1: expected a JSON object, got list"):
        data.load_jsonl(path)


def test_jsonl_to_examples_maps_fields(tmp_path, example_module):
    path = _write(
        tmp_path / "math.jsonl",
        [
            json.dumps({"question": "2*3?", "answer": 6, "steps": "2*3=6", "level": 2, "src": "x"}),
            json.dumps({"question": "1+1?", "answer": "2"}),
        ],
    )
    examples = data.jsonl_to_examples(path, solution_field="steps", difficulty_field="level")
    assert all(isinstance(e, example_module.Example) for e in examples)
    first, second = examples
    assert (first.id, first.prompt, first.answer, first.solution, first.difficulty) == (
        "math-0",
        "2*3?",
        "6",
        "2*3=6",
        2,
    )
    assert first.meta == {"src": "x"}
    default_difficulty = example_module.Example(id="x", prompt="", answer="").difficulty
    assert (second.id, second.answer, second.solution) == ("math-1", "2", None)
    assert second.difficulty == default_difficulty  # the field is absent: Example's default


def test_jsonl_to_examples_schema_error(tmp_path, example_module):
    path = _write(tmp_path / "bad.jsonl", ['{"question": "a", "answer": "1", "level": "x"}'])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: field 'level' must be int"):
        data.jsonl_to_examples(path, difficulty_field="level")
    path = _write(tmp_path / "bad2.jsonl", ['{"question": ["a"], "answer": "1"}'])
    with pytest.raises(ValueError, match=r"bad2\.jsonl:1: field 'question' must be str"):
        data.jsonl_to_examples(path)


# ------------------------------------------------------------------------- grain pipelines

RECORDS = [{"id": i} for i in range(10)]


def _ids(batch):
    return [r["id"] for r in batch]


def _take(iterator, n):
    return [_ids(next(iterator)) for _ in range(n)]


def test_batches_cover_each_epoch_with_a_new_seeded_order():
    it = data.prompt_iterator(RECORDS, batch_size=5, seed=0, shard_index=0, shard_count=1)
    epochs = [sum(_take(it, 2), []) for _ in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(10))  # a permutation per epoch
    assert len({tuple(e) for e in epochs}) == 3  # reshuffled each epoch
    again = data.prompt_iterator(RECORDS, batch_size=5, seed=0, shard_index=0, shard_count=1)
    assert [sum(_take(again, 2), []) for _ in range(3)] == epochs  # deterministic by seed
    other = data.prompt_iterator(RECORDS, batch_size=5, seed=1, shard_index=0, shard_count=1)
    assert sum(_take(other, 2), []) != epochs[0]


def test_no_shuffle_keeps_order_and_finite_epochs_end():
    it = data.prompt_iterator(
        RECORDS, batch_size=4, seed=0, shuffle=False, num_epochs=1, shard_index=0, shard_count=1
    )
    assert [_ids(b) for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # short last batch dropped
    it = data.prompt_iterator(
        RECORDS,
        batch_size=4,
        seed=0,
        shuffle=False,
        num_epochs=1,
        drop_remainder=False,
        shard_index=0,
        shard_count=1,
    )
    assert [_ids(b) for b in it][-1] == [8, 9]


def test_shards_are_disjoint_equal_and_cover_the_data():
    seen = []
    for index in range(3):
        it = data.prompt_iterator(
            RECORDS, batch_size=3, seed=7, num_epochs=1, shard_index=index, shard_count=3
        )
        shard = sum((_ids(b) for b in it), [])
        assert len(shard) == 3  # 10 // 3 records per host, so hosts step in lock-step
        assert all(i % 3 == index for i in shard)  # strided shard
        seen += shard
    assert sorted(seen) == list(range(9))


def test_default_shard_is_this_process():
    it = data.prompt_iterator(RECORDS, batch_size=10, seed=0, num_epochs=1)  # 1 process
    assert sorted(_ids(next(it))) == list(range(10))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="shard_index"):
        data.prompt_dataset(RECORDS, batch_size=2, seed=0, shard_index=3, shard_count=3)
    with pytest.raises(ValueError, match="batch_size"):
        data.prompt_dataset(RECORDS, batch_size=0, seed=0)
    with pytest.raises(ValueError, match="records"):
        data.prompt_dataset(RECORDS[:2], batch_size=1, seed=0, shard_index=0, shard_count=3)


def test_iterator_state_is_json_and_resumes_at_the_same_next_batch():
    kwargs = dict(batch_size=3, seed=11, shard_index=0, shard_count=1)
    it = data.prompt_iterator(RECORDS, **kwargs)
    _take(it, 5)  # crosses an epoch boundary
    state = json.loads(json.dumps(it.get_state()))
    expected = _take(it, 6)
    resumed = data.prompt_iterator(RECORDS, state=state, **kwargs)
    assert _take(resumed, 6) == expected
    fresh = data.prompt_iterator(RECORDS, **kwargs)
    fresh.set_state(state)
    assert _take(fresh, 6) == expected


def test_save_and_restore_iterator_files(tmp_path):
    kwargs = dict(batch_size=4, seed=3, shard_index=0, shard_count=1)
    it = data.prompt_iterator(RECORDS, **kwargs)
    _take(it, 3)
    data.save_iterator(tmp_path / "data_state", it)
    assert list((tmp_path / "data_state").iterdir())[0].name == "process_0-of-1.json"
    expected = _take(it, 4)
    restored = data.restore_iterator(
        tmp_path / "data_state", data.prompt_iterator(RECORDS, **kwargs)
    )
    assert _take(restored, 4) == expected


def test_orbax_checkpoint_manager_round_trip(tmp_path):
    """The trainer's path: the iterator is one item of an orbax Composite checkpoint."""
    kwargs = dict(batch_size=2, seed=5, shard_index=0, shard_count=1)
    it = data.prompt_iterator(RECORDS, **kwargs)
    _take(it, 7)
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    expected = _take(it, 5)
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        fresh = data.prompt_iterator(RECORDS, **kwargs)
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)),
        )["data"]
    assert _take(restored, 5) == expected


@pytest.mark.parametrize("content,needle", [
    (b'{"question": "a", "answer": "1"}\n{"question": "\xff\xfe", "answer": "2"}\n',
     ":2: not UTF-8 (byte 0xff at column 15)"),
    (b'{"question": "a", "answer": "1"}\n{"question": "b", "answer": NaN}\n',
     ":2: non-finite number NaN"),
    (b'{"question": "a", "answer": "1", "n": ' + b"9" * 5000 + b"}\n", ":1: Exceeds the limit"),
    (b'{"question": "a", "answer": "1", "n": 1e999}\n', ":1: field 'n' must be a finite number"),
    (b'{"question": "a"\n', ":1: invalid JSON"),
    (b"", ": no rows (the file is empty)"),
    (b"\n\n  \n", ": no rows (the file is empty)"),
])
def test_load_jsonl_every_malformed_row_names_file_and_line(tmp_path, content, needle):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        data.load_jsonl(path, schema={"question": str, "answer": str, "n": float},
                        required=("question", "answer"))
    message = str(error.value)
    assert message.startswith(str(path)) and needle in message, message
    assert "\n" not in message
