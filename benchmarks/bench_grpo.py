"""The GRPO iteration: grpo_jax against TRL's GRPOTrainer and Tunix's GRPOLearner, same shapes.

Workload (the same in all three): a random Qwen2-shaped model (4 layers, 4 heads, 2 KV heads,
head_dim H/4, MLP int(2.6875 H), q/k/v bias, tied head, float32, vocabulary 512) with a
word-level tokenizer; per iteration 8 prompts of 16 tokens x 8 completions x 64 new tokens at
temperature 1; beta 0.04 (the reference forward runs); one AdamW step (lr 1e-5) on the 64
completions; a Python reward that differs within groups (the share of even token ids).

grpo_jax runs its real `rl` stage (`grpo_jax.pipeline`) on a checkpoint written to a temporary
directory, once with host rewards and once with `rl.fused_steps` (the whole iteration on device,
with the device version of the same reward); seconds per iteration are the stage's
`step_time_s` (compilation excluded), median over the measured iterations. The per-phase split
times the same jitted pieces the stage calls (sampler, host decode + reward, reference
log-probs, train step) one by one. Each phase's model FLOP/s is divided by the matmul
throughput this script measures at that phase's shapes (`flops.matmul_flops_per_s`: decode rows
for sampling, [B*T] rows forward for the reference, forward + backward for the update), and the
FLOP floor is the sum of the phases' FLOPs at those throughputs. The floor is the workload's:
every row's prompt counted, as the peers compute it. grpo_jax runs each prompt once per group
of 8 in the sampler's prefill, the reference forward and the update
(`models.completion_logprobs`), 17% fewer FLOPs at these shapes; the floor of what it
computes (`flops.shared_prompt_forward_flops`) is printed beside it, and a fraction above 1
of the workload's floor is that saving.

The peers run in their own virtual environments (`benchmarks/peers/*.py`, one process each),
so nothing of theirs is a dependency of this project. With `--rounds R` every system runs R
times, the order rotated each round, so the machine's drift does not land on one of them:

    JAX_PLATFORMS=cpu python benchmarks/bench_grpo.py --hidden 128,256 --rounds 2 \
        --trl_python /work/peers/trl/bin/python --tunix_python /work/peers/tunix/bin/python

`--malloc reuse` (the default) sets glibc malloc to keep freed memory (`grpo_jax.host_memory`,
as the main job does) in this process and, through the `MALLOC_*` environment variables, in
the peers' processes, so all three run on the same allocator; `--malloc system` leaves every
process with glibc's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import flops  # noqa: E402
from grpo_jax.config_presets import main_job  # noqa: E402
from grpo_jax import host_memory  # noqa: E402
from grpo_jax.metrics import read_metrics  # noqa: E402
from grpo_jax.models import ModelConfig, Transformer, from_pretrained  # noqa: E402
from grpo_jax.models.hf import save_pretrained  # noqa: E402
from grpo_jax.pipeline import train_and_evaluate  # noqa: E402
from grpo_jax.rewards.device import register_device_reward  # noqa: E402
from grpo_jax.rl.algorithms import EstimatorInputs, compute_advantages  # noqa: E402
from grpo_jax.rl.rollout import Rollout, encode_prompts  # noqa: E402
from grpo_jax.rl.update import LossSettings, make_logp_fn, make_train_step  # noqa: E402
from grpo_jax.runner.rewards import register_reward_source  # noqa: E402
from grpo_jax.sampling import SamplingConfig, generate  # noqa: E402
from grpo_jax.tasks.base import Example, Task  # noqa: E402
from grpo_jax.tasks.registry import register_task  # noqa: E402
from grpo_jax.text import HFTokenizer  # noqa: E402
from grpo_jax.training import Policy, init_opt_state, make_optimizer  # noqa: E402

VOCAB, PROMPT_LEN, NEW_TOKENS, PROMPTS, GROUP = 512, 16, 64, 8, 8
# Word ids: t0 .. t507, then the template's "Q:" and "A:", then EOS and pad (the highest ids,
# as the TRL side has them).
Q_ID, A_ID, EOS_ID, PAD_ID = VOCAB - 4, VOCAB - 3, VOCAB - 2, VOCAB - 1
WORDS = [f"t{i}" for i in range(VOCAB - 4)] + ["Q:", "A:", "<eos>", "<pad>"]
WORD_IDS = {w: i for i, w in enumerate(WORDS)}


def model_config(hidden: int) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, hidden_size=hidden, num_layers=4, num_heads=4,
                       num_kv_heads=2, head_dim=hidden // 4, mlp_size=int(2.6875 * hidden),
                       max_seq_len=128, qkv_bias=True, tie_embeddings=True)


def write_checkpoint(path: str, hidden: int) -> None:
    """Random weights plus a word-level tokenizer.json (no BOS, EOS "<eos>", pad "<pad>")."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = model_config(hidden)
    save_pretrained(Transformer(config, rngs=nnx.Rngs(0)), config, path)
    tokenizer = Tokenizer(models.WordLevel(vocab=WORD_IDS, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<eos>", "pad_token": "<pad>"}, f)


@register_task("bench_words")
class WordsTask(Task):
    """Prompts of 14 random words: with the "plain" template ("Q: ... A:") 16 tokens."""

    name = "bench_words"

    def generate(self, rng, difficulty):
        words = " ".join(WORDS[i] for i in rng.integers(0, Q_ID, PROMPT_LEN - 2))
        return Example(id=f"bench:{words}", prompt=words, answer="0", solution="t0",
                       difficulty=difficulty)


def even_share(completion: str, example) -> float:
    """The share of completion tokens whose id is even."""
    del example
    ids = [WORD_IDS.get(w, PAD_ID) for w in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)


register_reward_source("even_share")(lambda run, section: even_share)


@register_device_reward("even_share")
def device_even_share(tokenizer):
    del tokenizer

    def fn(tokens, mask, answers):
        del answers
        text = mask & (tokens != EOS_ID) & (tokens != PAD_ID)  # what decoding keeps
        return jnp.sum(text & (tokens % 2 == 0), -1) / jnp.maximum(jnp.sum(text, -1), 1)

    return fn


def stage_config(checkpoint: str, steps: int, fused_steps: int, reuse_host_memory: bool):
    config = main_job()
    config.reuse_host_memory = reuse_host_memory
    config.stages = "rl"
    config.compilation_cache_dir = ""  # compile for real: the first iteration's compile time
    config.task.name = "bench_words"
    config.task.kwargs = {}
    config.task.prompt_len = PROMPT_LEN
    config.task.train_size = 2000
    config.task.eval_size = 8
    config.model.init_from = checkpoint
    config.model.max_seq_len = PROMPT_LEN + NEW_TOKENS
    config.optim.warmup_frac = 0.0
    rl = config.rl
    rl.steps, rl.num_prompts, rl.group_size = steps, PROMPTS, GROUP
    rl.max_new_tokens, rl.beta, rl.lr = NEW_TOKENS, 0.04, 1e-5
    rl.rewards = {"even_share": 1.0}
    rl.checkpoint_every = 0
    rl.fused_steps = fused_steps
    return config


def run_stage(checkpoint: str, workdir: str, *, warmup: int, iterations: int,
              fused_steps: int = 0, reuse_host_memory: bool = True) -> dict:
    """Our rl stage: median step seconds over the measured iterations, compile seconds."""
    chunk = max(fused_steps, 1)
    warmup = -(-warmup // chunk) * chunk  # whole programs
    steps = warmup + -(-iterations // chunk) * chunk
    train_and_evaluate(stage_config(checkpoint, steps, fused_steps, reuse_host_memory), workdir)
    rows = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
            if r.get("stage") == "rl"]
    measured = rows[warmup:]
    out = {"iteration_s": [r["step_time_s"] for r in measured],
           "compile_s": sum(r["compile_time_s"] for r in rows),
           "reward_std": statistics.mean(r["reward_std"] for r in measured)}
    if not fused_steps:
        out["sample_s"] = statistics.median(r["sample_time_s"] for r in measured)
        out["update_s"] = statistics.median(r["update_time_s"] for r in measured)
    return out


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn()` (blocked on its result) after one untimed call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sampled_rollout(checkpoint: str):
    """One rollout as the rl stage samples it at these shapes.

    Returns (policy, params, tokenizer, examples, sample, rollout): `sample()` is the
    sampler call, `rollout` the `rl.rollout.Rollout` of one such call (rewards 0: the
    caller's are set on the batch).
    """
    model, _ = from_pretrained(checkpoint)
    policy, params = Policy.from_model(model)
    tokenizer = HFTokenizer(checkpoint)
    examples = [ex for ex in WordsTask().examples("train", PROMPTS, seed=0) for _ in range(GROUP)]
    prompts, prompt_mask = encode_prompts(
        tokenizer, [f"Q: {ex.prompt}\nA: " for ex in examples], prompt_len=PROMPT_LEN)
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, eos_ids=tokenizer.eos_ids,
                              pad_id=tokenizer.pad_id)
    key = jax.random.key(0)
    sample = lambda: generate(policy.graphdef, policy.state(params), prompts, prompt_mask, key,
                              config=sampling)
    out = jax.device_get(sample())
    rollout = Rollout(prompt_tokens=prompts, prompt_mask=prompt_mask, tokens=out.tokens,
                      attention_mask=out.mask, loss_mask=out.mask, behaviour_logp=out.logp,
                      rewards=np.zeros(len(examples), np.float32), lengths=out.lengths,
                      version=0)
    return policy, params, tokenizer, examples, sample, rollout


def grpo_batch(policy, ref_params, rollout, rewards):
    """(the device RolloutBatch of `rollout` with GRPO advantages and reference log-probs,
    the reference log-prob function), as the rl stage builds them."""
    batch = jax.device_put(rollout.replace(rewards=np.asarray(rewards, np.float32)).to_batch())
    advantages = compute_advantages("grpo", EstimatorInputs(
        rewards=batch.rewards, correct=batch.rewards >= 1, mask=batch.loss_mask,
        group_size=GROUP))
    logp_fn = make_logp_fn(policy, prompt_len=PROMPT_LEN, group_size=GROUP)
    return batch.replace(advantages=advantages, ref_logp=logp_fn(
        ref_params, batch.tokens, batch.attention_mask)), logp_fn


def phase_split(checkpoint: str, repeats: int) -> dict:
    """Seconds of each piece of one iteration, called as the rl stage calls them."""
    policy, params, tokenizer, examples, sample, rollout = sampled_rollout(checkpoint)
    ref_params = jax.tree.map(jnp.copy, params)

    def host():  # what the rollout does on the host after sampling
        texts = [tokenizer.decode(rollout.tokens[i, : rollout.lengths[i]].tolist())
                 for i in range(len(examples))]
        rewards = np.asarray([even_share(t, ex) for t, ex in zip(texts, examples)], np.float32)
        return rewards

    batch, logp_fn = grpo_batch(policy, ref_params, rollout, host())
    optimizer, _ = make_optimizer(lr=1e-5, steps=100, warmup_frac=0.0)
    train_step = make_train_step(policy, optimizer, LossSettings(beta=0.04),
                                 prompt_len=PROMPT_LEN, micro_batches=1, group_size=GROUP)
    state = {"params": jax.tree.map(jnp.copy, params),
             "opt_state": init_opt_state(optimizer, params)}

    def update():
        state["params"], state["opt_state"], metrics = train_step(
            state["params"], state["opt_state"], batch)
        return metrics

    return {"sample_s": timed(sample, repeats), "host_s": timed(host, repeats),
            "reference_s": timed(lambda: logp_fn(ref_params, batch.tokens,
                                                 batch.attention_mask), repeats),
            "update_s": timed(update, repeats)}


def run_peer(python: str, script: str, hidden: int, warmup: int, iterations: int,
             malloc: str) -> dict:
    command = [python, os.path.join(HERE, "peers", script), "--hidden", str(hidden),
               "--warmup", str(warmup), "--iterations", str(iterations)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           **(host_memory.ENVIRONMENT if malloc == "reuse" else {})}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", default="128,256")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--fused_steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per phase")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every system in turn, the order rotated each round "
                             "(and the matmul throughput measured each round); the summary "
                             "gives medians over rounds and each ratio's range")
    parser.add_argument("--trl_python", default="")
    parser.add_argument("--tunix_python", default="")
    parser.add_argument("--json", default="", help="also write the figures here")
    parser.add_argument("--malloc", choices=("reuse", "system"), default="reuse",
                        help="reuse: glibc malloc keeps freed memory (grpo_jax.host_memory) in "
                             "this process and, through its environment variables, in the "
                             "peers' processes; system: the allocator's defaults for all")
    args = parser.parse_args()
    if args.malloc == "reuse":
        host_memory.reuse_freed_memory()  # before the backend starts its threads
    print(f"jax {jax.__version__}, devices {jax.devices()}, cpu_count {os.cpu_count()}, "
          f"malloc {args.malloc}, rounds {args.rounds}")
    hiddens = [int(h) for h in args.hidden.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in hiddens:
            config = model_config(hidden)
            rows, length = PROMPTS * GROUP, PROMPT_LEN + NEW_TOKENS
            checkpoint = os.path.join(tmp, f"checkpoint{hidden}")
            write_checkpoint(checkpoint, hidden)
            results[hidden] = {
                "hidden": hidden, "checkpoint": checkpoint, "rounds": [],
                "flops": {"sample": flops.generate_flops(config, rows, PROMPT_LEN, NEW_TOKENS),
                          "reference": flops.forward_flops(config, rows, length),
                          "update": flops.train_flops(config, rows, length)}}
            # What grpo_jax computes: each prompt once per group (the sampler's prefill, the
            # reference forward and the update).
            shared = flops.shared_prompt_forward_flops(config, rows, PROMPT_LEN, length, GROUP)
            results[hidden]["flops_done"] = {"sample": shared, "reference": shared,
                                             "update": 3 * shared}
        for r in range(args.rounds):
            for hidden in hiddens:
                figures = results[hidden]
                figures["rounds"].append(one_round(args, figures, r, tmp))
                if r == 0:
                    figures["phases"] = phase_split(figures["checkpoint"], args.repeats)
                report_round(figures, r)
        for hidden in hiddens:
            summary(results[hidden])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def one_round(args, figures: dict, index: int, tmp: str) -> dict:
    """Every system once at this hidden size, in an order rotated by the round's index, and
    the matmul throughput at the phases' shapes; seconds per iteration are medians."""
    hidden, checkpoint = figures["hidden"], figures["checkpoint"]
    config, rows, length = model_config(hidden), PROMPTS * GROUP, PROMPT_LEN + NEW_TOKENS
    reuse = args.malloc == "reuse"
    systems = [
        ("host", lambda: run_stage(checkpoint, os.path.join(tmp, f"host{hidden}_{index}"),
                                   warmup=args.warmup, iterations=args.iterations,
                                   reuse_host_memory=reuse)),
        ("fused", lambda: run_stage(checkpoint, os.path.join(tmp, f"fused{hidden}_{index}"),
                                    warmup=args.warmup, iterations=args.iterations,
                                    fused_steps=args.fused_steps, reuse_host_memory=reuse)),
    ]
    for name, python, script in (("trl", args.trl_python, "trl_grpo.py"),
                                 ("tunix", args.tunix_python, "tunix_grpo.py")):
        if python:
            systems.append((name, lambda python=python, script=script: run_peer(
                python, script, hidden, args.warmup, args.iterations, args.malloc)))
    shift = index % len(systems)
    out = {"order": [name for name, _ in systems[shift:] + systems[:shift]]}
    for name, run in systems[shift:] + systems[:shift]:
        out[name] = run()
    peak = {"sample": flops.matmul_flops_per_s(config, rows),
            "reference": flops.matmul_flops_per_s(config, rows * length),
            "update": flops.matmul_flops_per_s(config, rows * length, backward=True)}
    out["matmul_flops_per_s"] = peak
    out["floor_s"] = sum(figures["flops"][k] / peak[k] for k in peak)
    out["floor_done_s"] = sum(figures["flops_done"][k] / peak[k] for k in peak)
    return out


def seconds(round_figures: dict) -> dict:
    """System -> median seconds per iteration in one round."""
    return {name: statistics.median(round_figures[name]["iteration_s"])
            for name in ("host", "fused", "trl", "tunix") if name in round_figures}


def report_round(f: dict, index: int) -> None:
    rnd = f["rounds"][index]
    t, floor = seconds(rnd), rnd["floor_s"]
    ours, fused = t["host"], t["fused"]
    print(f"\n## hidden {f['hidden']}, round {index + 1} (order {', '.join(rnd['order'])}): "
          f"seconds per GRPO iteration (median)")
    print("| | s / iteration | FLOP-floor fraction | its time / grpo_jax host | "
          "its time / grpo_jax fused | first-iteration compile s |")
    print("|---|---|---|---|---|---|")
    print(f"| grpo_jax rl stage (host rewards) | {ours:.3f} | {floor / ours:.2f} | 1.00x | "
          f"{ours / fused:.2f}x | {rnd['host']['compile_s']:.1f} |")
    print(f"| grpo_jax rl stage (fused_steps) | {fused:.3f} | {floor / fused:.2f} | "
          f"{fused / ours:.2f}x | 1.00x | {rnd['fused']['compile_s']:.1f} |")
    for name in ("trl", "tunix"):
        if name in rnd:
            peer = t[name]
            print(f"| {name} {rnd[name].get('version', '')} | {peer:.3f} | {floor / peer:.2f} | "
                  f"{peer / ours:.2f}x | {peer / fused:.2f}x | "
                  f"{rnd[name].get('first_iteration_s', float('nan')):.1f} (whole iteration) |")
    print(f"| FLOP floor at the measured matmul throughput | {floor:.3f} | 1.00 | | | |")
    done = rnd["floor_done_s"]
    print(f"| ... of the FLOPs grpo_jax computes (each prompt once per group) | {done:.3f} | "
          f"{done / floor:.2f} | | | |")
    print(f"grpo_jax at the floor of its own FLOPs: host {done / ours:.2f}, fused "
          f"{done / fused:.2f}")
    if index:
        return
    p, peak = f["phases"], rnd["matmul_flops_per_s"]
    print("\nphases of one iteration (s; model GFLOP/s of the workload, then of what grpo_jax "
          "computes; fraction of the matmul GFLOP/s at the phase's shapes):")
    for name in ("sample", "reference", "update"):
        rate = f["flops"][name] / p[f"{name}_s"]
        rate_done = f["flops_done"][name] / p[f"{name}_s"]
        print(f"  {name:9s} {p[f'{name}_s']:.3f} s  {rate / 1e9:6.1f} / {rate_done / 1e9:6.1f} "
              f"GFLOP/s of {peak[name] / 1e9:6.1f}: {rate / peak[name]:.2f} / "
              f"{rate_done / peak[name]:.2f}")
    print(f"  host      {p['host_s']:.3f} s  (decode 64 completions + Python reward)")
    print(f"  sum {sum(p.values()):.3f} s; the host stage logged sample "
          f"{rnd['host']['sample_s']:.3f} s + update {rnd['host']['update_s']:.3f} s")


def summary(f: dict) -> None:
    """Medians over rounds; each ratio's median and range over the rounds."""
    rounds = [seconds(r) for r in f["rounds"]]
    floors = [r["floor_s"] for r in f["rounds"]]
    print(f"\n## hidden {f['hidden']}: summary over {len(rounds)} round(s)")
    done = [r["floor_done_s"] for r in f["rounds"]]
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        fractions = [fl / v for fl, v in zip(floors, values)]
        line = (f"  {name:6s} {statistics.median(values):.3f} s (rounds "
                f"{', '.join(f'{v:.3f}' for v in values)}); floor fraction "
                f"{statistics.median(fractions):.2f} ({min(fractions):.2f}-{max(fractions):.2f})")
        if name in ("host", "fused"):
            own = [d / v for d, v in zip(done, values)]
            line += f"; of its own FLOPs' floor {statistics.median(own):.2f}"
        print(line)
    for name in ("trl", "tunix"):
        if name in rounds[0]:
            ratios = [r[name] / min(r["host"], r["fused"]) for r in rounds]
            print(f"  {name} / best of ours: median {statistics.median(ratios):.2f}x, range "
                  f"{min(ratios):.2f}x-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
