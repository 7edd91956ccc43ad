"""Rollouts that do not wait for the longest row: continuous against static batching in the
sampler, packed against padded updates, and the whole RL step (sampling + update), on one
long-tailed workload, the arms alternated in one process.

The workload: bench_grpo.py's model (hidden 128 or 256, 4 layers, vocab 512, random
weights) samples 8 prompts x 8 completions at temperature 1 with 16 of its 512 ids as EOS,
so a row ends with probability about 1/32 per token: completion lengths are geometric
(mean about 32, long-tailed) up to the 192-token budget; the lengths are printed.

- `static`: `sampling.generate` with every row at once (each prompt prefilled once per
  group of 8, as the RL loop does); the batch runs until its longest row ends.
- `continuous`: the same rows in `--slots` slots (`SamplingConfig.slots`), a slot taking the
  next row when its row ends. Both write the same tokens (checked here).
- `padded_update`: the GRPO update step (`rl.update.make_train_step`: the clipped surrogate,
  beta 0.04, the entropy term, AdamW) on the sampled batch padded to the budget.
- `packed_update`: the same step on the rows packed into fixed blocks (`rl.packing`), which
  has the padded step's gradient.

tokens_per_s counts the sampled completion tokens per second of sampling, and the rows' real
tokens (prompt and completion) per second of an update. step_speedup is (static sampling +
padded update) / (continuous sampling + packed update), medians. The matmul chain (fwd+bwd)
measured in the same run gives the update's fraction of the machine's throughput.

With `--episodes`, the same rows as multi-turn episodes (`sampling.generate_episodes`): the
static samples' most frequent token (EOS and pad aside) closes a "call", a stub environment
answers each with 4 tokens, at most 3 turns; `static_episodes` runs every row at once (a
waiting row writes holes until the pause), `continuous_episodes` in `--slots` slots (a
waiting row keeps its slot and writes nothing); tokens_per_s counts the tokens written
(generated and observation) per second, host answers included.

With `--trl_python` (a venv with trl: benchmarks/README.md), TRL's GRPOTrainer runs the same
workload shape (`peers/trl_grpo.py --eos_ids 16`: its own random weights, prompts of 16
tokens, beta 0 so no reference pass, one AdamW step on the padded batch) in a subprocess
between the two halves of the rounds; `mode=trl_step` is its sampled tokens per second of a
whole iteration, and `step/trl` ours (continuous sampling + packed update) against it.

    JAX_PLATFORMS=cpu python benchmarks/bench_rollouts.py [--hidden 128] [--slots 16]
        [--rounds 5] [--episodes] [--trl_python /work/peers/trl/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import bench_grpo as grpo  # noqa: E402
import flops  # noqa: E402
from grpo_jax import host_memory  # noqa: E402
from grpo_jax.models import Transformer  # noqa: E402
from grpo_jax.rl.algorithms import ALGORITHMS  # noqa: E402
from grpo_jax.rl.batch import RolloutBatch  # noqa: E402
from grpo_jax.rl.packing import blocks_needed, pack_rows  # noqa: E402
from grpo_jax.rl.update import LossSettings, make_train_step  # noqa: E402
from grpo_jax.sampling import SamplingConfig, generate, pad_prompts  # noqa: E402
from grpo_jax.training import Policy, init_opt_state, make_optimizer  # noqa: E402

PROMPTS, GROUP, PROMPT_LEN, MAX_NEW = 8, 8, 16, 192
EOS_IDS = tuple(range(grpo.VOCAB - 4 - 16, grpo.VOCAB - 4))  # 16 of the word ids


class _IdTokenizer:
    """The episodes' stub tokenizer: a turn's text is its ids; an answer is 4 ids."""

    def decode(self, ids):
        return " ".join(map(str, ids))

    def encode(self, text):
        return [10 + len(text) % 100, 11, 12, 13]


def _answer(text):
    return f"<{len(text)}>"


def timed(fn, *args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--episodes", action="store_true",
                        help="also the rows as multi-turn episodes, static and in slots")
    parser.add_argument("--trl_python", default="",
                        help="a python with trl installed: TRL's GRPOTrainer on the workload")
    args = parser.parse_args(argv)
    host_memory.reuse_freed_memory()
    config = grpo.model_config(args.hidden).replace(max_seq_len=PROMPT_LEN + MAX_NEW)
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    policy, params = Policy.from_model(model)
    rng = np.random.default_rng(0)
    prompt_ids = [list(rng.integers(0, grpo.VOCAB - 20, rng.integers(8, PROMPT_LEN + 1)))
                  for _ in range(PROMPTS)]
    prompts, prompt_mask = map(jnp.asarray, pad_prompts(
        [ids for ids in prompt_ids for _ in range(GROUP)], PROMPT_LEN, pad_id=grpo.PAD_ID))
    key = jax.random.key(0)
    common = dict(max_new_tokens=MAX_NEW, eos_ids=EOS_IDS, pad_id=grpo.PAD_ID)
    samplers = {
        "static": SamplingConfig(**common, prompt_group=GROUP),
        "continuous": SamplingConfig(**common, slots=args.slots),
    }
    sample = {name: (lambda c=c: generate(graphdef, state, prompts, prompt_mask, key, config=c))
              for name, c in samplers.items()}
    outs = {name: jax.block_until_ready(fn()) for name, fn in sample.items()}  # compile
    same = bool(np.array_equal(outs["static"].tokens, outs["continuous"].tokens))
    lengths = np.asarray(outs["static"].lengths)
    generated = int(lengths.sum())

    # the sampled rows as the RL batch: prompt then completion, padded to the budget
    out = outs["static"]
    tokens = np.concatenate([np.asarray(prompts), np.asarray(out.tokens)], 1)
    mask = np.concatenate([np.asarray(prompt_mask), np.asarray(out.mask)], 1)
    rows = tokens.shape[0]
    batch = RolloutBatch(
        tokens=tokens, attention_mask=mask, loss_mask=np.asarray(out.mask),
        behaviour_logp=np.asarray(out.logp), rewards=rng.normal(size=rows).astype(np.float32),
        version=np.zeros(rows, np.int32),
        advantages=np.repeat(rng.normal(size=(rows, 1)), MAX_NEW, 1).astype(np.float32),
        old_logp=np.asarray(out.logp), ref_logp=np.asarray(out.logp))
    width = tokens.shape[1]
    blocks = blocks_needed(mask, width)
    packed = pack_rows(tokens, mask, PROMPT_LEN, num_blocks=blocks, block_len=width,
                       pad_id=grpo.PAD_ID)
    real = int(mask.sum())
    settings = LossSettings(beta=0.04, entropy_coef=0.001, on_policy=False,
                            objective=ALGORITHMS["grpo"].objective)
    optimizer, _ = make_optimizer(lr=1e-5, steps=1000, warmup_frac=0.0)
    step = make_train_step(policy, optimizer, settings, prompt_len=PROMPT_LEN, micro_batches=1)
    updates = {"padded_update": jax.device_put(batch),
               "packed_update": jax.device_put(batch.replace(packed=packed))}
    opt_state = init_opt_state(optimizer, params)
    update = {name: (lambda b=b: step(jax.tree.map(jnp.copy, params),
                                      jax.tree.map(jnp.copy, opt_state), b)[2])
              for name, b in updates.items()}
    for fn in update.values():  # compile
        jax.block_until_ready(fn())

    print(f"workload: {rows} rows ({PROMPTS} prompts x {GROUP}), budget {MAX_NEW} tokens; "
          f"completion lengths p10/p50/p90/max = "
          + "/".join(str(int(np.percentile(lengths, q))) for q in (10, 50, 90, 100))
          + f", mean {lengths.mean():.1f}; {generated} sampled tokens; the update's real "
          f"tokens {real} of {rows * width} padded positions ({real / (rows * width):.0%}), "
          f"packed into {blocks} blocks of {width}; continuous ({args.slots} slots) and static "
          f"tokens {'identical' if same else 'DIFFER'}")
    arms = {**sample, **update}
    episode_tokens = 0
    if args.episodes:
        sampled = np.asarray(out.tokens)[np.asarray(out.mask)]
        counts = np.bincount(sampled, minlength=grpo.VOCAB)
        counts[list(EOS_IDS) + [grpo.PAD_ID]] = 0
        stop = int(counts.argmax())
        print(f"episodes: token {stop} closes a call ({counts[stop]} of {sampled.size} "
              "sampled tokens)")
        episodes = _episode_arms(graphdef, state, prompts, prompt_mask, key, args.slots, stop)
        outs = {name: fn() for name, fn in episodes.items()}  # compile
        written = {name: int(np.asarray(o.attention_mask).sum()) for name, o in outs.items()}
        turns = np.asarray(outs["continuous_episodes"].turns)
        print(f"episodes: {written} tokens written (generated + observation), turns per row "
              f"mean {turns.mean():.2f} max {turns.max()}; static slots written "
              f"{int(outs['static_episodes'].length)}, continuous "
              f"{int(outs['continuous_episodes'].length)}")
        episode_tokens = written
        arms.update(episodes)
    times = {name: [] for name in arms}
    names = list(arms)
    trl = None
    for round_ in range(args.rounds):
        if args.trl_python and round_ == args.rounds // 2:
            trl = _trl(args)
        for name in (names if round_ % 2 == 0 else names[::-1]):
            times[name].append(timed(arms[name]))
    median = {name: statistics.median(t) for name, t in times.items()}
    chain = flops.matmul_flops_per_s(config, 256, backward=True)
    useful = 3 * sum(2 * flops.weights_per_token(config) * int(m.sum())
                     + flops.attention_flops(config, int(m.sum())) for m in mask)
    for name in arms:
        count = (generated if name in sample else episode_tokens[name]
                 if name.endswith("episodes") else real)
        extra = (f" fraction={useful / median[name] / chain:.2f}" if name in update else "")
        print(f"mode={name} tokens_per_s={count / median[name]:.0f} s={median[name]:.4f}"
              f"{extra} (rounds {min(times[name]):.4f}-{max(times[name]):.4f})")
    print(f"matmul chain fwd+bwd: {chain / 1e9:.1f} GFLOP/s")
    step_speedup = ((median["static"] + median["padded_update"])
                    / (median["continuous"] + median["packed_update"]))
    print(f"continuous/static={median['static'] / median['continuous']:.2f} "
          f"packed/padded={median['padded_update'] / median['packed_update']:.2f} "
          f"step_speedup={step_speedup:.2f}")
    if args.episodes:
        print(f"continuous/static episodes="
              f"{median['static_episodes'] / median['continuous_episodes']:.2f}")
    if trl is not None:
        ours = generated / (median["continuous"] + median["packed_update"])
        print(f"mode=trl_step tokens_per_s={trl['tokens_per_s']:.0f} s={trl['s']:.4f} "
              f"(trl {trl['version']}, sampled tokens per iteration "
              f"{trl['tokens_min']}-{trl['tokens_max']}, generate {trl['generate_s']:.4f} s)")
        print(f"step/trl={ours / trl['tokens_per_s']:.2f} (ours {ours:.0f} sampled tokens/s of "
              f"continuous sampling + packed update)")


def _episode_arms(graphdef, state, prompts, prompt_mask, key, slots: int, stop: int) -> dict:
    """The rows as episodes, every row at once and in `slots` slots (both host loops)."""
    from grpo_jax.sampling.episodes import EpisodeConfig, generate_episodes

    arms = {}
    for name, count in (("static_episodes", 0), ("continuous_episodes", slots)):
        config = EpisodeConfig(
            max_tokens=MAX_NEW, stop_ids=(stop,), max_turns=3, max_observation_tokens=4,
            sampling=SamplingConfig(max_new_tokens=1, eos_ids=EOS_IDS, pad_id=grpo.PAD_ID,
                                    prompt_group=GROUP if not count else 1, slots=count))
        arms[name] = (lambda c=config: generate_episodes(
            graphdef, state, prompts, prompt_mask, key, config=c, tokenizer=_IdTokenizer(),
            observe=_answer))
    return arms


def _trl(args) -> dict:
    """TRL's GRPOTrainer on the long-tailed workload in its own venv (`peers/trl_grpo.py`):
    its sampled tokens per second of an iteration (medians)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "trl_grpo.py")
    done = subprocess.run(
        [args.trl_python, script, "--hidden", str(args.hidden), "--new_tokens", str(MAX_NEW),
         "--prompts", str(PROMPTS), "--group", str(GROUP), "--prompt_len", str(PROMPT_LEN),
         "--eos_ids", str(len(EOS_IDS)), "--beta", "0", "--iterations", str(args.rounds),
         "--warmup", "2"], capture_output=True, text=True, env={**os.environ,
                                                                 "JAX_PLATFORMS": "cpu"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"bench_rollouts: {script} failed ({done.returncode}): "
                 f"{(done.stderr or done.stdout)[-2000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    rates = [t / s for t, s in zip(result["sampled_tokens"], result["iteration_s"])]
    return {"tokens_per_s": statistics.median(rates),
            "s": statistics.median(result["iteration_s"]), "version": result["version"],
            "generate_s": statistics.median(result["generate_s"]),
            "tokens_min": min(result["sampled_tokens"]),
            "tokens_max": max(result["sampled_tokens"])}


if __name__ == "__main__":
    main()
