"""Each prompt run once per group of completions, or once per row: A/B in one process.

The rl stage's batch is num_prompts groups of group_size completions of one prompt.
`models.completion_logprobs` (through `make_logp_fn` / `make_train_step` with
`group_size`) runs each group's prompt once and lets its completions attend to the shared
keys and values; without it (group_size 1) every row runs its own copy of the prompt. Both
also run the output head on the completion positions only. The sampler's prefill does the
same with `SamplingConfig.prompt_group`. This times, alternately in one process (the
machine's drift hits both alike), bench_grpo's sampler (64 new tokens on every row), its
reference forward and its GRPO update (8 prompts of 16 tokens x 8 completions of 64 new
tokens, beta 0.04, AdamW, row groups as the stage has them) with groups of 1 and 8, at each
hidden size:

    JAX_PLATFORMS=cpu python benchmarks/bench_prompt_groups.py [--hidden 128,256] [--rounds 10]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import bench_grpo as grpo  # noqa: E402
from bench_streams import alternate, compiled_step, grpo_update  # noqa: E402
from grpo_jax import host_memory  # noqa: E402
from grpo_jax.sampling import SamplingConfig, generate  # noqa: E402

GROUPS = (1, grpo.GROUP)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", default="128,256")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    host_memory.reuse_freed_memory()  # as the main job runs
    print(f"jax {jax.__version__}, cpu_count {os.cpu_count()}")
    calls = []  # (hidden, phase, group, call, times)
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in [int(h) for h in args.hidden.split(",")]:
            policy, params, optimizer, batch, make = grpo_update(hidden, tmp)
            tokens, mask = batch.tokens, batch.attention_mask
            prompts = (tokens[:, :grpo.PROMPT_LEN], mask[:, :grpo.PROMPT_LEN])
            ref, samples = {}, {}
            for group in GROUPS:
                # 64 new tokens on every row (no EOS), the prefill once per group or per row
                sampling = SamplingConfig(max_new_tokens=grpo.NEW_TOKENS, eos_ids=(-1,),
                                          pad_id=grpo.PAD_ID, prompt_group=group)
                sample = functools.partial(generate, policy.graphdef, policy.state(params),
                                           *prompts, jax.random.key(0), config=sampling)
                samples[group] = np.asarray(sample().tokens)
                calls.append((hidden, "sample", group, sample, []))
                logp_fn = grpo.make_logp_fn(policy, prompt_len=grpo.PROMPT_LEN, group_size=group)
                ref[group] = np.asarray(logp_fn(params, tokens, mask))
                calls.append((hidden, "reference", group,
                              lambda f=logp_fn, a=(params, tokens, mask): f(*a), []))
                call = compiled_step(make(policy, group).fn, params, optimizer, batch)
                loss = float(call()["loss"])
                print(f"hidden {hidden}, group {group}: first-step loss {loss:.7g}")
                calls.append((hidden, "update", group, call, []))
            diff = np.max(np.abs(ref[GROUPS[0]] - ref[GROUPS[1]]))
            same = np.array_equal(samples[GROUPS[0]], samples[GROUPS[1]])
            print(f"hidden {hidden}: max |reference log-prob difference| {diff:.2e}; "
                  f"the same sampled tokens: {same}")
    for *_, call, _ in calls:  # warm
        jax.block_until_ready(call())
    alternate(calls, args.rounds)
    calls.sort(key=lambda c: (c[0], c[1], c[2]))  # (hidden, phase): group 1, then 8
    for one, shared in zip(calls[::2], calls[1::2]):
        a, b = statistics.median(one[4]), statistics.median(shared[4])
        print(f"hidden {one[0]} {one[1]:>9}: per row {a * 1e3:7.1f} ms, per group of "
              f"{shared[2]} {b * 1e3:7.1f} ms, ratio {b / a:.3f}")


if __name__ == "__main__":
    main()
