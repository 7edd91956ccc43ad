"""Tokenizers: round trips, one id per tag, clear errors, save/load."""

import numpy as np
import pytest

from grpo_jax.tasks import apply_template, get_task
from grpo_jax.text import CharTokenizer, SentencePieceTokenizer, Tokenizer

COMPLETION = "<think>5*3=15 7+15=22</think><answer>22</answer>"


def test_char_ids_and_specials():
    tok = CharTokenizer("0123456789+-*= ")
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + 4 + 15
    assert [tok.token_to_id(t) for t in ("<think>", "</think>", "<answer>", "</answer>")] == [3, 4, 5, 6]
    assert tok.token_to_id("0") == 7 and tok.token_to_id("x") is None
    ids = tok.encode("<think>1+2=3</think>")
    assert ids == [3, 8, 17, 9, 20, 10, 4]
    assert isinstance(tok, Tokenizer)


def test_char_round_trip_and_tag_counts():
    tok = CharTokenizer.for_task(get_task("arithmetic"))
    text = "Q: 7+5*3\nA: " + COMPLETION
    ids = tok.encode(text)
    # 12 prompt chars + 4 tags + 17 + 2 characters inside.
    assert len(ids) == 12 + 4 + len("5*3=15 7+15=22") + 2
    assert tok.decode(ids) == text
    # pad / bos / eos are dropped by decode, tags are kept.
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id, tok.pad_id]) == text
    assert tok.decode(np.asarray(ids, np.int32)) == text
    # a partial tag is plain characters
    assert tok.decode(tok.encode("<thin")) == "<thin" and len(tok.encode("<thin")) == 5


def test_char_errors():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"'z' \(U\+007A\) at position 2"):
        tok.encode("abz")
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([999])
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab"])


def test_char_save_load(tmp_path):
    tok = CharTokenizer.for_texts(["hello world", "<think>1+1=2</think>"])
    assert "<" not in tok.chars  # tags removed before collecting characters
    path = tmp_path / "vocab.json"
    tok.save(path)
    loaded = CharTokenizer.load(path)
    assert loaded == tok and loaded.encode("hello 2") == tok.encode("hello 2")
    with pytest.raises(FileNotFoundError, match="for_task"):
        CharTokenizer.load(tmp_path / "missing.json")


def test_arithmetic_difficulty_one_fits_the_cpu_budget():
    """Plain prompt <= 16 tokens with BOS, completion + EOS <= 40 tokens."""
    task = get_task("arithmetic", difficulty=1)
    tok = CharTokenizer.for_task(task)
    rng = np.random.default_rng(0)
    for example in task.examples("train", 400, seed=3):
        assert len(tok.encode(apply_template(example, "plain"))) + 1 <= 16
        text, _ = task.solution(example, rng=rng, error_rate=0.5, format_error_rate=0.5)
        assert len(tok.encode(text)) + 1 <= 40
        assert tok.decode(tok.encode(example.solution)) == example.solution


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_train_load_round_trip(tmp_path, model_type):
    task = get_task("arithmetic")
    texts = [e.prompt + "\n" + e.solution for e in task.examples("train", 200, seed=0)]
    tok = SentencePieceTokenizer.train(texts, tmp_path / "spm", vocab_size=300, model_type=model_type)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 2, 3)
    for text in ["Q: 7+5*3\nA: " + COMPLETION, "unseen ü ✓ chars", "  two  spaces\n"]:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode(COMPLETION)
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert tok.token_to_id(tag) is not None and ids.count(tok.token_to_id(tag)) == 1
    # split_digits: a number is one piece per digit
    assert len(tok.encode("12345")) == 5
    loaded = SentencePieceTokenizer.load(tmp_path / "spm")
    assert loaded.encode(COMPLETION) == ids
    assert loaded.decode([loaded.bos_id, *ids, loaded.eos_id, loaded.pad_id]) == COMPLETION
    assert isinstance(loaded, Tokenizer)


def test_sentencepiece_missing_model_says_how_to_create(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"SentencePieceTokenizer.train\(texts"):
        SentencePieceTokenizer.load(tmp_path / "nothing")
