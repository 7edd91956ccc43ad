"""The `configs/gsm8k.py:gpu` GRPO iteration on one GPU, with random Qwen2.5-0.5B-shaped weights.

Nothing is downloaded: the script writes a random checkpoint of the Qwen2.5-0.5B shape
(494M parameters, bfloat16 compute over float32 master weights as the preset says), a byte-level
BPE tokenizer with a ChatML chat template, and 512 GSM8K-format rows into a scratch
directory, runs the preset's rl stage for `--steps` iterations, and prints per iteration:
seconds split into sampling and update, tokens per second, and the update's model FLOPs
utilisation against the GPU's dense bfloat16 peak (`--peak_tflops`, default the H100 / H200
SXM figure of 989).

    python benchmarks/gpu_gsm8k.py --steps 4 [--size qwen2.5-1.5b] [--scratch /tmp/gsm8k_gpu]

Model FLOPs of the update per iteration: 6 x parameters x tokens for the policy's forward and
backward, plus 2 x parameters x tokens for the reference forward (beta > 0), plus the
attention score and value products (12 x layers x heads x head_dim x T^2 per sequence for
forward + backward, 4 x ... for the forward-only reference pass), over the padded length;
remat's recomputation is not counted (MFU counts model FLOPs, not hardware FLOPs). The
first iteration (compilation) is reported separately and left out of the averages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}{% for message in messages %}{{ '<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _rows(n, offset=0):
    out = []
    for i in range(n):
        a, b = 3 + (i + offset) % 97, 2 + (i * 7 + offset) % 13
        out.append({
            "question": f"A shop sells {a} boxes of {b} pencils each. A teacher buys all of "
                        f"them and gives {b} pencils to each student. How many students get "
                        "pencils?",
            "answer": f"There are {a}*{b}=<<{a}*{b}={a * b}>>{a * b} pencils.\n"
                      f"{a * b}/{b}=<<{a * b}/{b}={a}>>{a} students.\n#### {a}"})
    return out


def write_assets(scratch: str, size: str) -> tuple[str, str]:
    """A random checkpoint of the named size with a BPE tokenizer, and GSM8K rows."""
    import jax
    from flax import nnx
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from grpo_jax.models import Transformer, named_config, save_pretrained

    ckpt, data = os.path.join(scratch, size), os.path.join(scratch, "gsm8k")
    os.makedirs(data, exist_ok=True)
    for name, rows in (("train.jsonl", _rows(512)), ("test.jsonl", _rows(128, 1000))):
        with open(os.path.join(data, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    if os.path.isfile(os.path.join(ckpt, "model.safetensors.index.json")) or \
            os.path.isfile(os.path.join(ckpt, "model.safetensors")):
        return ckpt, data
    config = named_config(size, param_dtype="float32", dtype="float32")
    config = config.replace(vocab_size=max(config.vocab_size, 4096),
                            max_seq_len=max(config.max_seq_len, 2048))
    with jax.default_device(jax.devices("cpu")[0]):
        model = Transformer(config, rngs=nnx.Rngs(0))
        save_pretrained(model, config, ckpt, max_shard_bytes=2 << 30)
    del model
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [r["question"] + " " + r["answer"] for r in _rows(2000)]
    corpus += ["<think> reasoning </think> <answer> 42 </answer>"] * 50
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(ckpt, "tokenizer.json"))
    with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": CHAT_TEMPLATE}, f)
    return ckpt, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--size", default="qwen2.5-0.5b")
    parser.add_argument("--scratch", default="/tmp/grpo_jax_gpu_bench")
    parser.add_argument("--peak_tflops", type=float, default=989.0)
    parser.add_argument("--set", action="append", default=[],
                        help="extra config override, e.g. --set rl.num_prompts=32")
    args = parser.parse_args()

    import jax

    from configs import gsm8k
    from grpo_jax.metrics import read_metrics
    from grpo_jax.models.hf import config_from_hf
    from grpo_jax.pipeline import train_and_evaluate

    t0 = time.time()
    ckpt, data = write_assets(args.scratch, args.size)
    print(f"assets in {time.time() - t0:.0f}s: {ckpt}, {data}", flush=True)
    config = gsm8k.get_config("gpu")
    config.model.init_from, config.task.kwargs.data_dir = ckpt, data
    config.task.train_size, config.task.eval_size = 512, 128
    config.stages = "rl"
    config.rl.steps = args.steps
    config.rl.checkpoint_every = 0
    config.rl.rewards = {"accuracy": 1.0, "format": 0.2}
    for item in args.set:
        key, value = item.split("=", 1)
        node = config
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = type(node[leaf])(json.loads(value) if not isinstance(node[leaf], str)
                                      else value)
    workdir = os.path.join(args.scratch, f"run_{int(time.time())}")
    t0 = time.time()
    train_and_evaluate(config, workdir)
    wall = time.time() - t0
    rows = [r for r in read_metrics(workdir) if r.get("stage") == "rl"]

    with open(os.path.join(ckpt, "config.json")) as f:
        shape = config_from_hf(json.load(f))
    params = shape.num_params()
    from grpo_jax.runner.build import build_tokenizer, prompt_bucket
    from grpo_jax.tasks import get_task

    task = get_task("gsm8k", data_dir=data)
    prompt_len = prompt_bucket(config, task, build_tokenizer(config, task, None))
    rows_per_step = config.rl.num_prompts * config.rl.group_size
    seq = prompt_len + config.rl.max_new_tokens
    attention = 4 * shape.num_layers * shape.num_heads * shape.head_dim * seq * seq
    fwd = 2 * params * seq + attention  # one forward of one sequence (padded length)
    update_flops = rows_per_step * (3 * fwd + fwd)  # policy forward + backward, reference
    print(f"\n{args.size}: {params / 1e6:.0f}M parameters, {jax.devices()[0].device_kind}, "
          f"{rows_per_step} sequences x {seq} tokens (prompt bucket {prompt_len} + "
          f"{config.rl.max_new_tokens} new) per iteration; wall {wall:.0f}s")
    print("| step | sample s | update s | step s | generated tok/s | update MFU |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        generated = rows_per_step * r["completion_length"]
        mfu = update_flops / r["update_time_s"] / (args.peak_tflops * 1e12)
        print(f"| {r['stage_step']} | {r['sample_time_s']:.2f} | {r['update_time_s']:.2f} | "
              f"{r['step_time_s']:.2f} | {generated / r['sample_time_s']:.0f} | "
              f"{100 * mfu:.1f}% |")
    steady = rows[1:] or rows
    mean = {k: sum(r[k] for r in steady) / len(steady)
            for k in ("sample_time_s", "update_time_s", "step_time_s", "completion_length")}
    print(f"steady state (steps 2..{len(rows)}): sample {mean['sample_time_s']:.2f}s, update "
          f"{mean['update_time_s']:.2f}s, iteration {mean['step_time_s']:.2f}s, "
          f"{rows_per_step * seq / mean['step_time_s']:.0f} tokens/s overall, update MFU "
          f"{100 * update_flops / mean['update_time_s'] / (args.peak_tflops * 1e12):.1f}%")


if __name__ == "__main__":
    main()
