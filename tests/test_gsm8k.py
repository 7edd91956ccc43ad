"""GSM8K offline: answer parsing, local JSONL, TFDS data_source (mock_data, real array_record)."""

import json
import os

import pytest
import tensorflow_datasets as tfds

from grpo_jax.tasks import gsm8k

ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A shop sells 1,000 pens a day for 3 days. How many pens?",
        "answer": "It sells 1000*3 = <<1000*3=3000>>3000 pens.\n#### 3,000",
    },
    {
        "question": "Tom had 5 dollars and spent 7.5. What is his balance?",
        "answer": "His balance is 5-7.5 = <<5-7.5=-2.5>>-2.5 dollars.\nSo -2.5.\nDone.\n#### -2.5",
    },
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _check_examples(examples, split):
    assert [e.answer for e in examples] == ["72", "3000", "-2.5"]
    first = examples[0]
    assert first.id == f"gsm8k-{split}-0"
    assert first.prompt == ROWS[0]["question"]
    assert first.solution == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May."
    )
    assert [e.difficulty for e in examples] == [2, 1, 3]  # solution lines
    assert first.meta["raw_answer"] == ROWS[0]["answer"]
    assert first.meta["split"] == split


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a\n#### 72", "72"),
        ("#### 1,234,567", "1234567"),
        ("x\n####  -3.5 ", "-3.5"),
        ("#### $12", "12"),
        ("a #### b #### 4", "4"),
    ],
)
def test_extract_answer(text, expected):
    assert gsm8k.extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize("text", ["no marker 72", "#### seventy", "#### ", "#### 1 2"])
def test_extract_answer_rejects_malformed(text):
    with pytest.raises(ValueError, match="####"):
        gsm8k.extract_gsm8k_answer(text)


def test_load_gsm8k_jsonl(tmp_path):
    examples = gsm8k.load_gsm8k_jsonl(_write_jsonl(tmp_path / "test.jsonl", ROWS))
    _check_examples(examples, "test")


def test_load_gsm8k_jsonl_bad_rows_name_the_line(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [ROWS[0], {"question": "q"}])
    with pytest.raises(ValueError, match=r"train\.jsonl:2: missing required field 'answer'"):
        gsm8k.load_gsm8k_jsonl(path)
    path = _write_jsonl(tmp_path / "t2.jsonl", [ROWS[0], {"question": "q", "answer": "42"}])
    with pytest.raises(ValueError, match=r"t2\.jsonl: gsm8k t2 row 1: field 'answer': .*####"):
        gsm8k.load_gsm8k_jsonl(path)


def test_mock_data_with_realistic_records():
    """tfds.testing.mock_data can replace the data source: bytes values, like array_record."""

    def as_data_source(self, split, decoders=None, deserialize_method=None, **kwargs):
        del self, decoders, deserialize_method, kwargs
        assert split == "test[:3]"
        return [{k: v.encode() for k, v in row.items()} for row in ROWS]

    with tfds.testing.mock_data(as_data_source_fn=as_data_source):
        examples = gsm8k.load_gsm8k("test[:3]", data_dir="/nonexistent/tfds")
    _check_examples(examples, "test")


def test_mock_data_random_records_fail_with_the_row():
    """mock_data's default random text has no '#### <number>': the error names the row."""
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(ValueError, match=r"gsm8k train row 0: field 'answer'"):
            gsm8k.load_gsm8k("train", data_dir="/nonexistent/tfds")


def test_real_array_record_prepared_offline(tmp_path):
    """prepare_gsm8k builds real array_record files from local JSONL (no network, no TF)."""
    jsonl_dir = tmp_path / "grade_school_math"
    jsonl_dir.mkdir()
    _write_jsonl(jsonl_dir / "train.jsonl", ROWS[:2])
    _write_jsonl(jsonl_dir / "test.jsonl", ROWS)
    prepared = gsm8k.prepare_gsm8k(tmp_path / "tfds", jsonl_dir=jsonl_dir)
    assert any(p.endswith(".array_record-00000-of-00001") for p in os.listdir(prepared))
    test = gsm8k.load_gsm8k("test", data_dir=tmp_path / "tfds")
    # TFDS stores examples in its own (hash) order; compare as sets of figures.
    assert sorted(e.answer for e in test) == sorted(["72", "3000", "-2.5"])
    assert len(gsm8k.load_gsm8k("train", data_dir=tmp_path / "tfds")) == 2
    assert len(gsm8k.load_gsm8k("test[:2]", data_dir=tmp_path / "tfds")) == 2
    by_answer = {e.answer: e for e in test}
    assert by_answer["72"].solution.startswith("Natalia sold 48/2 = 24 clips")
    with pytest.raises(ValueError, match="test_socratic"):
        gsm8k.load_gsm8k("test_socratic", data_dir=tmp_path / "tfds")


def test_not_prepared_error_says_how_to_prepare(tmp_path):
    with pytest.raises(gsm8k.GSM8KNotPreparedError) as info:
        gsm8k.load_gsm8k("test", data_dir=tmp_path / "empty")
    message = str(info.value)
    assert "tfds build gsm8k --file_format=array_record" in message
    assert "load_gsm8k_jsonl" in message and "prepare_gsm8k" in message
    assert isinstance(info.value, FileNotFoundError)


def test_unknown_split():
    with pytest.raises(ValueError, match="unknown GSM8K split 'validation'"):
        gsm8k.load_gsm8k("validation", data_dir="/nonexistent")
