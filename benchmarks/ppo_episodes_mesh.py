"""PPO on tool episodes over N virtual CPU devices: a reproducer for XLA:CPU's dispatch deadlock.

    python benchmarks/ppo_episodes_mesh.py --devices 8 --workdir /tmp/ppo8 --test_flags

runs `configs/tools.py:smoke`'s pretraining, then 2 PPO steps on multi-turn calculator
episodes with the rows and weights sharded over `--devices` virtual CPU devices
(`--test_flags`: the test suite's XLA flags, `-O0` and the classic emitters, which make a
device's programs slower), and prints the PPO rows.

What it found: when the host dispatches many small multi-device programs without waiting
(the PPO learner once gathered each batch leaf of each minibatch eagerly), one device can
have more than 32 programs queued. Its next launch then blocks on the device's in-flight
semaphore while the other devices' threads wait in that program's all-reduce rendezvous.
Those are the threads that would drain the queue, so the process deadlocks (every thread
idle; with XLA's default collective timeouts, 20 s + 40 s, it aborts instead with
"Expected 8 threads to join the rendezvous, but only 7 of them arrived on time"). This is
XLA:CPU's async dispatch (jax-ml/jax#25861), not an ordering of our collectives. The
learners now run an iteration, every minibatch included, as one jitted program
(`rl.batch.scan_minibatches`), and this run completes. Its 4-device form is a test
(tests/test_tool_rl.py).
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--test_flags", action="store_true",
                        help="XLA without LLVM optimisation and with the classic emitters")
    args = parser.parse_args()
    flags = f"--xla_force_host_platform_device_count={args.devices}"
    if args.test_flags:
        flags += " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from grpo_jax.config_presets import tool_job
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate
    from grpo_jax.stages import default_section

    config = tool_job("smoke")
    config.stages = "pretrain,ppo"
    config.mesh.num_devices = args.devices
    config.ppo = default_section("ppo")
    config.ppo.update(tools="calc", max_turns=2, max_observation_tokens=16, max_new_tokens=48,
                      num_prompts=16, group_size=1, rewards={"accuracy": 1.0, "format": 0.2},
                      steps=2, beta=0.05)
    start = time.time()
    train_and_evaluate(config, args.workdir)
    for row in read_metrics(os.path.join(args.workdir, "metrics.jsonl")):
        if row["stage"] == "ppo":
            print({k: row[k] for k in ("stage_step", "tool_calls", "grad_norm",
                                       "critic_grad_norm", "logp_diff_max")})
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
