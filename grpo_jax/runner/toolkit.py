"""Small helpers every stage kind uses: optimizer, progress bar, prompts, sampling settings,
device batches on the data mesh, and step logging."""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
from tqdm.auto import tqdm

from grpo_jax import tasks as tasks_lib
from grpo_jax.compilation import CLOCK
from grpo_jax.sampling import SamplingConfig
from grpo_jax.training import make_optimizer


def stage_optimizer(run, *, lr: float, steps: int):
    """(AdamW with warmup + cosine + clipping from config.optim, its lr schedule)."""
    o = run.config.optim
    return make_optimizer(lr=lr, steps=steps, warmup_frac=o.warmup_frac,
                          final_lr_frac=o.final_lr_frac, weight_decay=o.weight_decay,
                          b1=o.b1, b2=o.b2, clip_norm=o.clip_norm)


PLAIN_PROGRESS_SECONDS = 30.0  # off a terminal: one progress line at most this often


class PlainProgress:
    """The progress bar's interface as plain lines on stdout, for runs whose output is not
    a terminal (SLURM, nohup, `> log`, sweep children), where a bar shows nothing: a line
    at most every `interval` seconds and one at the end."""

    def __init__(self, name: str, total: int, initial: int, interval: float):
        self.name, self.total, self.n, self.interval = name, total, initial, interval
        self.start_n, self.start = initial, time.time()
        self.last, self.last_printed, self.postfix = self.start, initial, {}

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.time() - self.last >= self.interval:
            self._print()

    def set_postfix(self, **values) -> None:
        self.postfix = values

    def close(self) -> None:
        if self.last_printed != self.n:
            self._print()

    def _print(self) -> None:
        now = time.time()
        rate = (now - self.start) / max(self.n - self.start_n, 1)
        shown = "".join(f", {k} {v}" for k, v in self.postfix.items())
        print(f"[grpo_jax] {self.name}: step {self.n}/{self.total}{shown}, {rate:.2f} s/step",
              flush=True)
        self.last, self.last_printed = now, self.n


def progress(stage, total: int, initial: int, *, interval: float = PLAIN_PROGRESS_SECONDS):
    """A progress bar on a terminal, plain lines elsewhere (`PlainProgress`)."""
    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=f"{stage.name}", leave=False,
                    mininterval=2.0)
    return PlainProgress(stage.name, total, initial, interval)


def prompt_text(run, example) -> str:
    """The example's prompt in the run's template (rendered with the run's tokenizer for
    "chat")."""
    return tasks_lib.apply_template(example, template=run.config.task.template,
                                    tokenizer=run.tokenizer)


def sampling_config(run, *, max_new_tokens: int, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_ids=tuple(run.tokenizer.eos_ids),
        pad_id=run.tokenizer.pad_id,
    )


def add_off_policy_fields(section) -> None:
    """The stale-rollout fields of an RL section (`rl_loop`), with their defaults."""
    # Off-policy rollouts: K > 0 samples the rollouts that update t trains on with the
    # parameters of update t - K (the first K + 1 batches with the stage's initial ones), a
    # pipelined schedule whose pending rollouts are checkpointed with the stage. The update
    # then corrects with off_policy_correction: none (ratio against the sampler's
    # log-probs) | tis (truncated importance weights, cap is_cap) | mis (tokens whose weight
    # leaves [mis_low, mis_high] dropped) | decoupled (AReaL's; rl.update.off_policy_weights)
    section.max_staleness = 0
    section.off_policy_correction = "tis"
    section.is_cap = 2.0
    section.mis_low = 0.5
    section.mis_high = 2.0


def add_tool_fields(section) -> None:
    """The multi-turn fields of a sampling section (`runner.rollouts.tool_episodes`)."""
    # A tool name (grpo_jax.tools.TOOLS: calc) turns on multi-turn episodes: a turn ends
    # when the policy closes a call (<calc>12*34</calc>), the tool's answer
    # (<result>408</result>) is appended to the context, attended to but never trained
    # on, and the policy goes on from its KV cache. max_new_tokens bounds the whole
    # episode (generated and observation tokens). "" = single-turn sampling.
    section.tools = ""
    section.max_turns = 4  # the most tool answers an episode gets
    section.max_observation_tokens = 24  # an answer's width in tokens (a longer one is cut)
    # The most slots a row that closed its call waits before the loop stops for the host to
    # answer it (its answer is then written beside the rows still generating).
    section.max_wait_tokens = 4


def section_sampling(run, section, *, temperature: float = 1.0) -> SamplingConfig:
    """The sampling settings of an RL section (max_new_tokens, top_k, top_p); its rollouts
    hold group_size completions of each prompt, so the prefill runs once per group."""
    config = sampling_config(run, max_new_tokens=section.max_new_tokens,
                             temperature=temperature, top_k=section.top_k, top_p=section.top_p)
    return dataclasses.replace(config, prompt_group=section.get("group_size", 1))


def device_batch(run, batch):
    """A host batch (a pytree of [B, ...] arrays) placed with rows over the data mesh."""
    return jax.device_put(batch, run.data_sharding)


class StepTimer:
    """Wall seconds of a step's phases, with the compilation inside them logged apart.

        timer = StepTimer()
        ...sample...;  timer.lap("sample")
        ...update...;  timer.lap("update")
        record.update(timer.record())  # sample_time_s, update_time_s, step_time_s,
                                       # compile_time_s (0 once everything is compiled)
    """

    def __init__(self):
        self._wall, self._compile = time.time(), CLOCK.seconds()
        self._start = self._wall, self._compile
        self._laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        wall, compile_s = time.time(), CLOCK.seconds()
        self._laps[name] = max(0.0, (wall - self._wall) - (compile_s - self._compile))
        self._wall, self._compile = wall, compile_s

    def record(self) -> dict:
        wall, compile_s = time.time() - self._start[0], CLOCK.seconds() - self._start[1]
        return {**{f"{name}_time_s": s for name, s in self._laps.items()},
                "step_time_s": max(0.0, wall - compile_s), "compile_time_s": compile_s}


SAMPLES_PER_LOG = 4  # generated texts kept per eval stage and per RL sample log
SAMPLE_EVERY = 10  # RL steps between sample logs (and the first step)


def log_samples(run, stage, examples, texts, rewards, components, *,
                limit: int = SAMPLES_PER_LOG) -> None:
    """The first `limit` (prompt, completion, reward) of a batch in samples.jsonl and
    TensorBoard (`MetricWriter.write_samples`), at the run's current global step."""
    rows = []
    for i in range(min(limit, len(texts))):
        rows.append({"prompt": prompt_text(run, examples[i]), "completion": texts[i],
                     "reward": float(rewards[i]),
                     **{name: float(value[i]) for name, value in components.items()}})
    run.writer.write_samples(run.global_step, rows, stage=stage.name)


def log_step(run, stage, record: dict, bar=None, **postfix) -> None:
    """One training step: +1 global step, one metrics line, the progress bar moved."""
    run.global_step += 1
    run.writer.write(run.global_step, record, stage=stage.name)
    if bar is not None:
        bar.update(1)
        if postfix:
            bar.set_postfix(**{k: f"{record[v]:.3f}" for k, v in postfix.items()
                               if v in record})
