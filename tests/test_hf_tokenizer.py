"""HFTokenizer over a tiny tokenizer.json built with the `tokenizers` package."""

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")

from grpo_jax.text.hf import HFTokenizer

SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<think>", "</think>"]
CORPUS = ["12 + 34 = 46", "the answer is 46", "think step by step", "7 * 6 = 42"] * 20


def build(tmp_path, with_config=True):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    if with_config:
        (tmp_path / "tokenizer_config.json").write_text(
            json.dumps(
                {"pad_token": "<|endoftext|>", "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
            )
        )
    return tokenizer


def test_round_trip_and_specials(tmp_path):
    raw = build(tmp_path)
    tok = HFTokenizer(tmp_path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)  # order of SPECIALS
    assert tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)
    text = "12 + 34 = 46, the answer"
    ids = tok.encode(text)
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id, tok.pad_id]) == text
    assert tok.token_to_id("<think>") == 3 and tok.token_to_id("nope-token") is None
    # Multi-character merges happened: fewer ids than bytes.
    assert len(tok.encode("the answer is 46")) < len("the answer is 46")


def test_defaults_without_config_and_errors(tmp_path):
    build(tmp_path, with_config=False)
    tok = HFTokenizer(tmp_path / "tokenizer.json")
    assert tok.eos_id == 0  # "<|endoftext|>" is the first eos spelling present
    assert tok.pad_id == 0 and tok.bos_id == 1
    assert HFTokenizer(tmp_path, eos_token="</think>").eos_id == 4
    with pytest.raises(ValueError, match="eos_token='<nope>' is not in the vocabulary"):
        HFTokenizer(tmp_path, eos_token="<nope>")
    with pytest.raises(ValueError, match="tokenizer.json not found"):
        HFTokenizer(tmp_path / "missing")
