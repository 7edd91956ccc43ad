"""The `configs/gsm8k.py:gpu` GRPO iteration on one GPU, with random Qwen2.5-0.5B-shaped weights.

Nothing is downloaded: the script writes a random checkpoint of the Qwen2.5-0.5B shape
(494M parameters, bfloat16 compute over float32 master weights as the preset says), a byte-level
BPE tokenizer with a ChatML chat template, and 512 GSM8K-format rows into a scratch
directory, runs the preset's rl stage for `--steps` iterations, and prints per iteration:
seconds split into sampling and update, tokens per second, and the update's model FLOPs
utilisation against the GPU's dense bfloat16 peak (`--peak_tflops`, default the H100 / H200
SXM figure of 989).

    python benchmarks/gpu_gsm8k.py --steps 4 [--size qwen2.5-1.5b] [--scratch /tmp/gsm8k_gpu]

Model FLOPs of the update per iteration (`update_model_flops`) are those of the passes the
update runs, counted as the code computes them (`models.completion_logprobs`): each group's
prompt once (the G rows of a group share it), every row's completion positions, the output
head on completion positions only, causal attention (each query against the keys before it,
not the full square), and per pass 1x forward, 3x for forward + backward: the policy's
forward and backward plus the reference forward when beta > 0 (an on-policy GRPO step needs
no separate old-policy pass). Remat's recomputation is not counted (MFU counts model FLOPs,
not hardware FLOPs). The first iteration (compilation) is reported separately and left out
of the averages.

Sampling is measured as the rollout's time (`sample_time_s`), which includes host-side
decoding and scoring: an upper bound on the device sampler's time. It is printed against the
HBM bandwidth bound of decoding (`decode_bytes_per_step`: every decode step reads the bf16
weights once and the KV cache of the batch; `--hbm_tbps`, default the H200's 4.8).
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


def _body_and_head(shape) -> tuple[int, int]:
    """(parameters of the layers, parameters of the output head) of a ModelConfig: the head
    is the embedding matrix when tied (it also embeds, a lookup without FLOPs)."""
    embed = shape.vocab_size * shape.hidden_size
    untied_head = 0 if shape.tie_embeddings else embed
    return shape.num_params() - embed - untied_head, embed


def update_model_flops(shape, *, prompts: int, group_size: int, prompt_len: int,
                       new_tokens: int, reference: bool) -> dict:
    """Model FLOPs of one GRPO update over `prompts` x `group_size` rows of `prompt_len` +
    `new_tokens` tokens, as `completion_logprobs` computes them; a dict of the parts and
    "total" (see the module docstring)."""
    body, head = _body_and_head(shape)
    p, c = prompt_len, new_tokens
    per_head_layer = shape.num_layers * shape.num_heads * shape.head_dim
    # Causal attention: the QK^T and AV products, 2 FLOPs per multiply-add, each query
    # against the keys up to it: P^2 / 2 pairs in the prompt, C * P + C^2 / 2 for a completion.
    prompt = 2 * body * p + 4 * per_head_layer * (p * p / 2)
    row = 2 * body * c + 2 * head * c + 4 * per_head_layer * (c * p + c * c / 2)
    forward = prompts * (prompt + group_size * row)
    passes = 3 + (1 if reference else 0)
    return {"forward": forward, "passes": passes, "total": passes * forward,
            "prompt_share": prompts * prompt / forward,
            "head_share": prompts * group_size * 2 * head * c / forward}


def decode_bytes_per_step(shape, *, rows: int, context: int, weight_bytes: int = 2,
                          cache_bytes: int = 2) -> float:
    """Bytes one decode step reads: the weights once, and every row's KV cache of `context`
    positions (keys and values of each layer's KV heads)."""
    weights = weight_bytes * shape.num_params()
    cache = (cache_bytes * 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim
             * context * rows)
    return weights + cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--size", default="qwen2.5-0.5b")
    parser.add_argument("--scratch", default="/tmp/grpo_jax_gpu_bench")
    parser.add_argument("--peak_tflops", type=float, default=989.0)
    parser.add_argument("--hbm_tbps", type=float, default=4.8,
                        help="HBM bandwidth in TB/s (H200 4.8, H100 SXM 3.35)")
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
    flops = update_model_flops(shape, prompts=config.rl.num_prompts,
                               group_size=config.rl.group_size, prompt_len=prompt_len,
                               new_tokens=config.rl.max_new_tokens,
                               reference=config.rl.beta is not None and config.rl.beta != 0)
    update_flops = flops["total"]
    print(f"\n{args.size}: {params / 1e6:.0f}M parameters, {jax.devices()[0].device_kind}, "
          f"{rows_per_step} sequences x {seq} tokens (prompt bucket {prompt_len} + "
          f"{config.rl.max_new_tokens} new) per iteration; wall {wall:.0f}s")
    print(f"update model FLOPs {update_flops / 1e12:.0f} TFLOP per iteration ({flops['passes']} "
          f"forward-equivalents; prompts {100 * flops['prompt_share']:.0f}%, output head "
          f"{100 * flops['head_share']:.0f}% of a forward)")
    # Decoding: the mean context over the completion, every row of the rollout at once.
    step_bytes = decode_bytes_per_step(shape, rows=rows_per_step,
                                       context=prompt_len + config.rl.max_new_tokens // 2)
    bound_s = config.rl.max_new_tokens * step_bytes / (args.hbm_tbps * 1e12)
    print(f"sampler bandwidth bound: {bound_s:.2f}s per rollout ({step_bytes / 1e9:.2f} GB "
          f"per decode step x {config.rl.max_new_tokens} steps at {args.hbm_tbps} TB/s)")
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
          f"{100 * update_flops / mean['update_time_s'] / (args.peak_tflops * 1e12):.1f}%, "
          f"sampling at {bound_s / mean['sample_time_s']:.2f} of the bandwidth bound (host "
          "decoding and scoring included)")


if __name__ == "__main__":
    main()
