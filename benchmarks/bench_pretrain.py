"""The main job's pretraining step as a fraction of the matmul throughput at its shapes.

Runs the pretrain stage of configs/default.py (tiny-1m, batch 64 x 64 tokens, the char
tokenizer, on the main job's corpus) for --steps steps through `grpo_jax.pipeline`, takes the median `step_time_s`
after the first --skip steps (compilation is logged apart and excluded), and divides the
model FLOP/s (forward + backward of the batch at its row length, the longest row
rounded up to 8, as the stage pads it; `flops.train_flops`) by the throughput
of the model's matmul chain with its backward at 64 * 64 rows measured in the same run.

    JAX_PLATFORMS=cpu python benchmarks/bench_pretrain.py [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402

import flops  # noqa: E402
from configs import default as default_config  # noqa: E402
from grpo_jax import tasks  # noqa: E402
from grpo_jax.metrics import read_metrics  # noqa: E402
from grpo_jax.pipeline import train_and_evaluate  # noqa: E402
from grpo_jax.runner.build import build_tokenizer, model_config_for  # noqa: E402
from grpo_jax.sft.data import encode_pairs  # noqa: E402
from grpo_jax.stages.supervised import pretraining_corpus  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=5)
    args = parser.parse_args()
    config = default_config.get_config()
    full = config.pretrain.steps * config.pretrain.batch_size
    config.stages = "pretrain"
    config.pretrain.steps = args.steps
    config.pretrain.corpus_size = full  # the main job's rows, so its row length
    config.compilation_cache_dir = ""
    task = tasks.get_task(config.task.name, **config.task.kwargs.to_dict())
    tokenizer = build_tokenizer(config, task, None)
    model = model_config_for(config, tokenizer.vocab_size)
    run = types.SimpleNamespace(task=task, config=config, tokenizer=tokenizer)
    prompts, completions = pretraining_corpus(run, full, seed=config.seed)
    length = encode_pairs(tokenizer, prompts, completions, max_len=config.model.max_seq_len,
                          loss_on_prompt=True)["tokens"].shape[1]
    with tempfile.TemporaryDirectory() as workdir:
        train_and_evaluate(config, workdir)
        rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    step = statistics.median(r["step_time_s"] for r in rows[args.skip:])
    batch = config.pretrain.batch_size
    work = flops.train_flops(model, batch, length)
    peak = flops.matmul_flops_per_s(model, batch * length, backward=True)
    print(f"jax {jax.__version__}, cpu_count {os.cpu_count()}; {config.model.name}: hidden "
          f"{model.hidden_size}, {model.num_layers} layers, vocab {model.vocab_size}; batch "
          f"{batch} x {length} tokens")
    print(f"pretrain step {step * 1e3:.1f} ms (median of {len(rows) - args.skip}), "
          f"compile {rows[0]['compile_time_s']:.1f} s; model {work / step / 1e9:.1f} GFLOP/s "
          f"of {peak / 1e9:.1f} GFLOP/s matmul (fwd+bwd at {batch * length} rows): "
          f"fraction {work / step / peak:.2f}")


if __name__ == "__main__":
    main()
