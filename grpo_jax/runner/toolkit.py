"""Small helpers every stage kind uses: optimizer, progress bar, prompts, sampling settings,
device batches on the data mesh, and step logging."""

from __future__ import annotations

import sys
import time

import jax
from tqdm.auto import tqdm

from grpo_jax.compilation import CLOCK
from grpo_jax.runner.prompts import prompt_of
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
    at most every `interval` seconds and one at the end. The seconds per step leave out
    compilation, which the line names apart ("0.42 s/step, 12.3 s compiling"); the line ends
    with the stage's wall time so far and the time left at that rate ("elapsed 1:02, ETA
    0:29", `clock_text`)."""

    def __init__(self, name: str, total: int, initial: int, interval: float):
        self.name, self.total, self.n, self.interval = name, total, initial, interval
        self.start_n, self.start, self.compile_start = initial, time.time(), CLOCK.seconds()
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
        compiling = CLOCK.seconds() - self.compile_start
        rate = max(0.0, now - self.start - compiling) / max(self.n - self.start_n, 1)
        shown = "".join(f", {k} {v}" for k, v in self.postfix.items())
        apart = f", {compiling:.1f} s compiling" if compiling >= 0.05 else ""
        left = rate * max(self.total - self.n, 0)
        print(f"[grpo_jax] {self.name}: step {self.n}/{self.total}{shown}, {rate:.2f} s/step"
              f"{apart}, elapsed {clock_text(now - self.start)}, ETA {clock_text(left)}",
              flush=True)
        self.last, self.last_printed = now, self.n


def clock_text(seconds: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour (59 -> "0:59", 3725 -> "1:02:05")."""
    minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress(stage, total: int, initial: int, *, interval: float = PLAIN_PROGRESS_SECONDS):
    """A progress bar on a terminal, plain lines elsewhere (`PlainProgress`)."""
    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=f"{stage.name}", leave=False,
                    mininterval=2.0)
    return PlainProgress(stage.name, total, initial, interval)


def prompt_text(run, example, tools=None) -> str:
    """The example's prompt in the run's template (`prompts.prompt_of`)."""
    return prompt_of(run.config, getattr(run, "task", None), run.tokenizer, example, tools)


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
                limit: int = SAMPLES_PER_LOG, step: int | None = None) -> None:
    """The first `limit` (prompt, completion, reward) of a batch in samples.jsonl and the
    trackers (`MetricWriter.write_samples`), at `step` (default: the run's global step)."""
    rows = []
    for i in range(min(limit, len(texts))):
        rows.append({"prompt": prompt_text(run, examples[i]), "completion": texts[i],
                     "reward": float(rewards[i]),
                     **{name: float(value[i]) for name, value in components.items()}})
    run.writer.write_samples(run.global_step if step is None else step, rows,
                             stage=stage.name)


def stage_record_step(run) -> int:
    """The step of a line that a stage logs without a step of its own (an eval's figures, a
    selection's counts): the number of the checkpoint that will end the stage. A kill before
    that checkpoint is written resumes from an earlier one, whose `truncate_after` drops the
    line with the rest of the stage; the stage then logs it again, once."""
    return run.global_step + 1


# Reward terms a stage adds without rl.rewards naming them (rl.overlong_cache's soft
# punishment, at most 0): the progress line shows them beside the reward they are part of.
IMPLICIT_REWARDS = ("overlong",)


def log_step(run, stage, record: dict, bar=None, **postfix) -> None:
    """One training step: +1 global step, one metrics line, the progress bar moved with
    `postfix` (label -> record key) shown; a shown "reward_mean" names the implicit terms in
    it ("reward -0.812 (overlong -0.812)")."""
    run.global_step += 1
    run.writer.write(run.global_step, record, stage=stage.name)
    if bar is not None:
        if postfix:  # before the update, whose line shows them
            bar.set_postfix(**{k: _shown(record, v) for k, v in postfix.items()
                               if v in record})
        bar.update(1)


def _shown(record: dict, key: str) -> str:
    text = f"{record[key]:.3f}"
    if key != "reward_mean":
        return text
    parts = [f"{name} {record[f'reward/{name}']:.3f}" for name in IMPLICIT_REWARDS
             if f"reward/{name}" in record]
    return f"{text} ({', '.join(parts)})" if parts else text
