"""Update steps with the batch in 1 and in 2 row groups (`Policy.batch_streams`), alternated.

`training.accumulate_gradients` can split each (micro-)batch into row groups whose gradients
are computed independently in one program; XLA:CPU then runs the groups' small element-wise
ops side by side on the cores (`training.default_batch_streams`: 2 on a single-device CPU).
This compiles the same step with 1 and with 2 groups and times them alternately in one
process (the machine's drift hits both alike), for:

- `128`, `256`: the GRPO update of bench_grpo.py at that hidden size (8 prompts x 8
  completions of 64 new tokens sampled by the model, beta 0.04, AdamW);
- `pre`: the main job's pretraining step (configs/default.py, tiny-1m, one packed batch of 64
  examples).

    JAX_PLATFORMS=cpu python benchmarks/bench_streams.py [--steps 128,256,pre] [--rounds 15]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import bench_grpo as grpo  # noqa: E402
from bench_pretrain import main_job_corpus  # noqa: E402
from grpo_jax.config_presets import main_job  # noqa: E402
from grpo_jax import host_memory  # noqa: E402
from grpo_jax.models import Transformer  # noqa: E402
from grpo_jax.runner.model_init import model_config_for  # noqa: E402
from grpo_jax.sft.data import encode_pairs, epoch_batches, pack_rows, packed_rows_for  # noqa
from grpo_jax.sft.loss import make_supervised_step  # noqa: E402
from grpo_jax.training import Policy, default_batch_streams, init_opt_state, make_optimizer  # noqa


def grpo_update(hidden: int, tmp: str):
    """(policy, params, optimizer, batch, make_step) of bench_grpo's update at `hidden`;
    make_step(policy, group=8) shares each prompt over its group of 8, as the rl stage does."""
    checkpoint = os.path.join(tmp, f"checkpoint{hidden}")
    grpo.write_checkpoint(checkpoint, hidden)
    policy, params, _, examples, _, rollout = grpo.sampled_rollout(checkpoint)
    rewards = np.random.default_rng(0).random(len(examples)).astype(np.float32)
    batch, _ = grpo.grpo_batch(policy, params, rollout, rewards)
    optimizer, _ = make_optimizer(lr=1e-5, steps=100, warmup_frac=0.0)
    make = lambda p, group=grpo.GROUP: grpo.make_train_step(  # noqa: E731
        p, optimizer, grpo.LossSettings(beta=0.04), prompt_len=grpo.PROMPT_LEN,
        micro_batches=1, group_size=group)
    return policy, params, optimizer, batch, make


def pretraining_step():
    """The same for the main job's pretraining step on one packed batch."""
    config = main_job()
    tokenizer, prompts, completions = main_job_corpus(config, config.pretrain.batch_size * 50)
    rows = epoch_batches(len(prompts), config.pretrain.batch_size, 0, seed=config.seed)
    length = config.pretrain.pack_len
    padded = encode_pairs(tokenizer, [prompts[i] for i in rows],
                          [completions[i] for i in rows], seq_len=length, loss_on_prompt=True)
    packed = pack_rows(padded, packed_rows_for(padded.attention_mask.sum(1),
                                               [np.arange(len(rows))], length))
    model = Transformer(model_config_for(config, tokenizer.vocab_size), rngs=nnx.Rngs(0))
    policy, params = Policy.from_model(model)
    optimizer, _ = make_optimizer(lr=config.pretrain.lr, steps=config.pretrain.steps)
    make = lambda p: make_supervised_step(p, optimizer)  # noqa: E731
    return policy, params, optimizer, jax.device_put(packed), make


def compiled_step(fn, params, optimizer, batch, *, with_text: bool = False):
    """A call of the jitted update `fn(params, opt_state, batch)` on its own copy of the
    state (donated and carried from call to call); returns the step's metrics. With
    `with_text`, (the call, the optimized HLO's text)."""
    state = [jax.tree.map(jnp.copy, params), init_opt_state(optimizer, params)]
    step = jax.jit(fn, donate_argnums=(0, 1)).lower(*state, batch).compile()

    def call():
        state[0], state[1], metrics = step(state[0], state[1], batch)
        return metrics

    return (call, step.as_text()) if with_text else call


def alternate(calls, rounds: int) -> None:
    """Times each call (blocked on its result) once per round, in turn: every entry is a
    tuple (..., call, times) whose list `times` gets the seconds."""
    for _ in range(rounds):
        for *_, call, times in calls:
            start = time.perf_counter()
            jax.block_until_ready(call())
            times.append(time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="128,256,pre")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    host_memory.reuse_freed_memory()  # as the main job runs
    print(f"jax {jax.__version__}, cpu_count {os.cpu_count()}, "
          f"default_batch_streams() {default_batch_streams()}")
    calls = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.steps.split(","):
            policy, params, optimizer, batch, make = (
                pretraining_step() if name == "pre" else grpo_update(int(name), tmp))
            for streams in (1, 2):
                call = compiled_step(make(dataclasses.replace(policy, batch_streams=streams)).fn,
                                     params, optimizer, batch)
                loss = float(call()["loss"])
                for _ in range(2):
                    jax.block_until_ready(call())
                calls.append((name, streams, loss, call, []))
    alternate(calls, args.rounds)
    for one, two in zip(calls[::2], calls[1::2]):
        a, b = statistics.median(one[4]), statistics.median(two[4])
        print(f"{one[0]:>4}: 1 group {a * 1e3:7.1f} ms, 2 groups {b * 1e3:7.1f} ms, "
              f"ratio {b / a:.3f} (first-step loss {one[2]:.6g} vs {two[2]:.6g})")


if __name__ == "__main__":
    main()
