"""A real checkpoint end to end: a tiny random Qwen2 with a byte-level BPE tokenizer and a
chat template, GSM8K rows on disk, `configs/gsm8k.py:smoke` GRPO with the checkpoint's own
tokenizer, export, and transformers loading the export with its tokenizer."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from grpo_jax.main import cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K_CONFIG = os.path.join(ROOT, "configs", "gsm8k.py")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# A ChatML-style template with a default system turn, as instruct checkpoints ship them.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a careful "
    "assistant.<|im_end|>\n{% endif %}{% for message in messages %}{{ '<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROWS = [  # GSM8K release format: worked solution with calculator annotations, "#### n"
    ("Tom has {a} apples and buys {b} more. How many apples does he have?",
     "Tom has {a}+{b}=<<{a}+{b}={s}>>{s} apples.\n#### {s}"),
    ("A box holds {a} pens. How many pens are in {b} boxes?",
     "There are {a}*{b}=<<{a}*{b}={p}>>{p} pens.\n#### {p}"),
]


def _rows(n: int, offset: int) -> list[dict]:
    out = []
    for i in range(n):
        a, b = 3 + i + offset, 2 + (i * 7 + offset) % 9
        question, answer = ROWS[i % 2]
        values = {"a": a, "b": b, "s": a + b, "p": a * b}
        out.append({"question": question.format(**values), "answer": answer.format(**values)})
    return out


def _write_tokenizer(directory, *, chat_template_file: bool = False) -> int:
    """A byte-level BPE tokenizer.json + tokenizer_config.json (+ generation_config.json);
    returns the vocabulary size."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

    # Qwen2's pipeline: NFC, its split pattern (digits one by one), byte-level BPE.
    tok = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [r["question"] + " " + r["answer"] for r in _rows(40, 0)]
    corpus += ["<think> reasoning </think> <answer> 42 </answer>", "system user assistant",
               "Reason step by step inside tags, then give only the final answer."] * 10
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(os.path.join(directory, "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "model_max_length": 512}
    if chat_template_file:
        with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
            f.write(CHAT_TEMPLATE)
    else:
        settings["chat_template"] = CHAT_TEMPLATE
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(settings, f)
    _write_generation_config(directory, tok)
    return tok.get_vocab_size(with_added_tokens=True)


def _write_generation_config(directory, tok=None):
    """Two end ids, as instruct checkpoints list them (end of turn, end of text)."""
    if tok is None:
        tok = tokenizers.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [tok.token_to_id("<|im_end|>"),
                                    tok.token_to_id("<|endoftext|>")]}, f)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """(checkpoint dir, GSM8K data dir): a random 2-layer Qwen2 whose embedding has more
    rows than the tokenizer has ids (as Qwen2's), and 12 / 6 GSM8K rows."""
    root = tmp_path_factory.mktemp("real")
    ckpt, data = root / "qwen2-tiny", root / "gsm8k"
    ckpt.mkdir()
    data.mkdir()
    vocab = _write_tokenizer(ckpt)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=-(-vocab // 64) * 64, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(ckpt, safe_serialization=True)
    _write_generation_config(ckpt)  # save_pretrained wrote its own
    for name, rows in (("train.jsonl", _rows(12, 0)), ("test.jsonl", _rows(6, 100))):
        with open(data / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return ckpt, data


def _smoke_config(ckpt, data):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gsm8k_config", GSM8K_CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("smoke")
    config.model.init_from = str(ckpt)
    config.task.kwargs.data_dir = str(data)
    return config


def test_checkpoint_tokenizer_specials_and_chat_template(assets, tmp_path):
    from grpo_jax.tasks import apply_template
    from grpo_jax.text import HFTokenizer, prompt_ids

    ckpt, _ = assets
    ours = HFTokenizer(ckpt)
    theirs = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    assert ours.bos_id == -1  # tokenizer_config.json: "bos_token": null
    assert ours.eos_id == theirs.convert_tokens_to_ids("<|im_end|>")
    assert ours.pad_id == theirs.convert_tokens_to_ids("<|endoftext|>")
    assert ours.eos_ids == (ours.eos_id, ours.pad_id)  # generation_config.json adds one
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    rendered = ours.apply_chat_template(messages)
    assert rendered == theirs.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert ours.encode(rendered) == theirs(rendered, add_special_tokens=False)["input_ids"]
    # No BOS is prepended when the tokenizer has none; the special tokens are single ids.
    ids = prompt_ids(ours, rendered)
    assert ids == ours.encode(rendered) and ids[0] == ours.token_to_id("<|im_start|>")
    # The "chat" template puts the question and the layout instruction in the user turn.
    prompt = apply_template("What is 3 + 4?", template="chat", tokenizer=ours)
    assert "What is 3 + 4?\nReason step by step inside <think> </think>" in prompt
    with pytest.raises(ValueError, match="needs its tokenizer"):
        apply_template("What is 3 + 4?", template="chat")
    # A chat_template.jinja file is read as well (newer exports keep it there).
    other = tmp_path / "jinja"
    other.mkdir()
    _write_tokenizer(other, chat_template_file=True)
    assert HFTokenizer(other).apply_chat_template(messages) == rendered


def test_dtype_objects_are_accepted(assets):
    import jax.numpy as jnp

    from grpo_jax.models import from_pretrained

    ckpt, _ = assets
    model, config = from_pretrained(ckpt, dtype=jnp.bfloat16, param_dtype=np.float32)
    assert (config.dtype, config.param_dtype) == ("bfloat16", "float32")
    assert model.embedding.value.dtype == jnp.float32
    with pytest.raises(ValueError, match="unsupported"):
        from_pretrained(ckpt, dtype=jnp.int32)


def test_gsm8k_smoke_grpo_export_and_transformers_logits(assets, tmp_path):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.export import main as export_main
    from grpo_jax.metrics import read_metrics
    from grpo_jax.models import from_pretrained
    from grpo_jax.pipeline import train_and_evaluate
    from grpo_jax.runner.rewards import REWARD_SOURCES

    ckpt, data = assets
    config = _smoke_config(ckpt, data)
    # The random model earns no task reward; the share of digits in the completion differs
    # within each group, so the two GRPO steps have real advantages and gradients.
    REWARD_SOURCES["digit_share"] = lambda run, section: (
        lambda completion, example: sum(c.isdigit() for c in completion) / max(
            len(completion), 1))
    try:
        config.rl.rewards = {"accuracy": 1.0, "format": 0.2, "digit_share": 1.0}
        workdir = tmp_path / "run"
        summary = train_and_evaluate(config, str(workdir))
    finally:
        del REWARD_SOURCES["digit_share"]
    rows = read_metrics(workdir)
    rl = [r for r in rows if r.get("stage") == "rl"]
    assert [r["stage_step"] for r in rl] == [1, 2]
    assert any(r["reward_std"] > 0 for r in rl) and all(r["grad_norm"] > 0 for r in rl)
    assert {"pass@1", "pass@2", "pass@1_lenient", "pass@2_lenient",
            "maj@2_lenient"} <= set(summary["after"])
    assert "pass@1_lenient" in (workdir / "report.md").read_text()
    recorded = json.loads((workdir / "config.json").read_text())
    assert recorded["task"]["prompt_len"] == 0  # as given; the run measured its bucket

    out = tmp_path / "export"
    assert export_main([f"--workdir={workdir}", f"--out={out}"]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "generation_config.json"):
        assert (out / name).is_file(), name

    # transformers loads the export with its tokenizer; its logits equal ours on the run's
    # final parameters.
    with Checkpointer(workdir / "checkpoints") as checkpointer:
        state, meta = checkpointer.restore()
    assert meta["stage"] == "eval_final"
    model, _ = from_pretrained(ckpt, dtype="float32")
    graph_state = nnx.state(model)
    nnx.replace_by_pure_dict(graph_state, jax.tree.map(np.asarray, state["params"]))
    nnx.update(model, graph_state)
    original, _ = from_pretrained(ckpt, dtype="float32")
    assert not np.allclose(np.asarray(model.embedding.value),
                           np.asarray(original.embedding.value))  # RL changed the policy

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(out),
                                                                 dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tom has 3 apples and buys 4 more."}], tokenize=False,
        add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids])).logits.numpy()
    mine = np.asarray(model(jnp.asarray([ids], jnp.int32)))
    np.testing.assert_allclose(mine, theirs, atol=2e-5, rtol=1e-4)


def _run_cli(args, capsys):
    code = cli(["main", f"--config={GSM8K_CONFIG}:smoke", *args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("preset", ["gpu", "tpu"])
def test_accelerator_presets_validate(assets, tmp_path, capsys, preset):
    """The gpu and tpu presets pass every start-up check on a real checkpoint layout (the
    fixture's data has 12 / 6 problems, so the sizes are lowered to fit)."""
    ckpt, data = assets
    code = cli(["main", f"--config={GSM8K_CONFIG}:{preset}", f"--config.model.init_from={ckpt}",
                f"--config.task.kwargs.data_dir={data}", "--config.task.train_size=12",
                "--config.task.eval_size=6", "--print_config", f"--workdir={tmp_path / 'r'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "bfloat16 compute" in out and "float32 params" in out
    assert ("fsdp=8" if preset == "tpu" else "data=1, fsdp=1") in out
    assert not (tmp_path / "r").exists()


def test_start_up_errors_are_one_line(assets, tmp_path, capsys):
    ckpt, data = assets
    base = [f"--config.model.init_from={ckpt}", f"--config.task.kwargs.data_dir={data}"]
    workdir = tmp_path / "never"

    # The measured bucket (prompt_len 0) is shown by --print_config.
    code = cli(["main", f"--config={GSM8K_CONFIG}:smoke", *base, "--print_config"])
    printed = capsys.readouterr().out
    assert code == 0 and "prompt bucket:" in printed and "(measured" in printed
    needed = int(printed.split("prompt bucket: ")[1].split()[0])

    # A bucket that is too short names the length needed.
    code, err = _run_cli([*base, "--config.task.prompt_len=8", f"--workdir={workdir}"], capsys)
    assert code == 2 and len(err) == 1 and "task.prompt_len: 8 cannot hold prompt" in err[0]
    longest = int(err[0].split("expected >= ")[1].split()[0])
    assert needed - 8 < longest <= needed and needed % 8 == 0  # auto rounds up to 8

    # The context must hold the bucket plus the completion budget.
    code, err = _run_cli([*base, "--config.model.max_seq_len=64", f"--workdir={workdir}"],
                         capsys)
    assert code == 2 and len(err) == 1 and "exceeds model.max_seq_len 64" in err[0]

    # A vocabulary the tokenizer's ids do not fit into.
    small = tmp_path / "small-vocab"
    small.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (small / name).write_bytes((ckpt / name).read_bytes())
    hf = json.loads((ckpt / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**hf, "vocab_size": 100}))
    code, err = _run_cli([f"--config.model.init_from={small}",
                          f"--config.task.kwargs.data_dir={data}", f"--workdir={workdir}"],
                         capsys)
    assert code == 2 and len(err) == 1
    assert "tokenizer: its ids reach" in err[0] and "vocabulary of 100 rows" in err[0]

    # A checkpoint without its tokenizer.
    (small / "tokenizer.json").unlink()
    code, err = _run_cli([f"--config.model.init_from={small}",
                          f"--config.task.kwargs.data_dir={data}", f"--workdir={workdir}"],
                         capsys)
    assert code == 2 and len(err) == 1 and "has no tokenizer.json" in err[0]

    # No GSM8K data where the config says.
    code, err = _run_cli([f"--config.model.init_from={ckpt}",
                          f"--config.task.kwargs.data_dir={tmp_path}", f"--workdir={workdir}"],
                         capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(
        "config error: task.kwargs.data_dir: expected a directory with GSM8K's train.jsonl")

    # More training problems asked for than the data has.
    code, err = _run_cli([*base, "--config.task.train_size=50", f"--workdir={workdir}"],
                         capsys)
    assert code == 2 and len(err) == 1 and "task.train_size: gsm8k train: asked for 50" in err[0]
    assert not workdir.exists()


def test_export_errors_are_one_line(tmp_path, capsys):
    from grpo_jax.export import main as export_main

    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()

    def one_line(args):
        assert export_main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        return err[0]

    assert "is not a grpo_jax run directory" in one_line([f"--workdir={run}", f"--out={out}"])
    (run / "config.json").write_text(json.dumps({"stages": "rl", "tokenizer": "char",
                                                 "model": {"init_from": ""}}))
    assert "no checkpoint in" in one_line([f"--workdir={run}", f"--out={out}"])
    (run / "checkpoints").mkdir()
    assert "inside the run directory" in one_line([f"--workdir={run}", f"--out={run / 'x'}"])
    assert "--dtype: 'int8' unsupported" in one_line(
        [f"--workdir={run}", f"--out={out}", "--dtype=int8"])
    assert "required: --out" in one_line([f"--workdir={run}"])
    assert not out.exists()
