"""What a run is built from is built once: validation builds the task, the tokenizer and the
prompt bucket and the Run uses them (a sentencepiece tokenizer is trained by the Run, in its
workdir, and only there); stage seeds come from one function."""

from __future__ import annotations

import collections

import pytest

from grpo_jax import text
from grpo_jax.pipeline import describe, train_and_evaluate
from grpo_jax.runner.run import derive_seed
from grpo_jax.tasks import registry as task_registry

from configs import default as default_config


@pytest.fixture
def builds(monkeypatch):
    """Counts constructions of the arithmetic task and of every tokenizer class, wherever
    they happen (the registry's factory and the classes' __init__ are wrapped)."""
    counts = collections.Counter()
    factory = task_registry._REGISTRY["arithmetic"]

    def task(**kwargs):
        counts["task"] += 1
        return factory(**kwargs)

    monkeypatch.setitem(task_registry._REGISTRY, "arithmetic", task)
    for cls in (text.CharTokenizer, text.SentencePieceTokenizer, text.HFTokenizer):
        init = cls.__init__

        def counted(self, *args, _init=init, **kwargs):
            counts["tokenizer"] += 1
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counted)
    return counts


def tiny_config(tokenizer: str):
    config = default_config.get_config("smoke")
    config.stages = "pretrain"
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.pretrain.update(dict(steps=1, batch_size=8))
    config.task.train_size = 64
    config.tokenizer = tokenizer
    config.tokenizer_vocab_size = 320  # sentencepiece: above its 256 byte pieces and tags
    return config


@pytest.mark.parametrize("tokenizer", ["char", "sentencepiece"])
def test_a_run_builds_its_task_and_tokenizer_once(tmp_path, builds, tokenizer):
    train_and_evaluate(tiny_config(tokenizer), str(tmp_path))
    assert builds == {"task": 1, "tokenizer": 1}
    assert (tmp_path / "tokenizer").is_dir() == (tokenizer == "sentencepiece")


def test_print_config_builds_them_once(builds):
    describe(tiny_config("char"))
    assert builds == {"task": 1, "tokenizer": 1}


def test_stage_seeds_are_one_function_of_seed_stage_and_purpose():
    seed = derive_seed(0, "rl", "problems")
    assert seed == derive_seed(0, "rl", "problems") and 0 <= seed < 2**31
    others = {derive_seed(0, "rl", "batches"), derive_seed(0, "final_rl", "problems"),
              derive_seed(1, "rl", "problems")}
    assert seed not in others and len(others) == 3
    with pytest.raises(TypeError, match="named by a string"):
        derive_seed(0, 1, "problems")  # a position is not what a stage is
