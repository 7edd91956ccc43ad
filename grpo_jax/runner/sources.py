"""The RL loop's rollout sources: where the batches `Learner.iteration` trains on come from.

    HostSource    one iteration per call: sample, decode and score on the host (any reward,
                  multi-turn episodes), dynamic sampling, the overlong ramp, and the queue of
                  rollouts sampled ahead of their update (rl.max_staleness)
    DeviceSource  K iterations per call in one XLA program (`rl.fused`): sampling, device
                  rewards and the learner's iteration, with one host round trip

A source (`Source`) has `settings` (the stage's `LoopSettings`), `steps(step, iterator,
learner) -> [metrics line]` (the rollout fields, the learner's metrics and the timings; a
"samples" item (examples, texts, rewards, components) for the sample log), `restore_target`
/ `restore` / `checkpoint` for what it keeps in the stage's checkpoint, and `check(check,
settings)`: what it cannot do, as ConfigError lines, run by the kind's validation before
stage 0. Both run the learner's one `iteration`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import parallel
from grpo_jax.rewards import overlong_penalty
from grpo_jax.rewards.accuracy import undecided_comparisons
from grpo_jax.rewards.python import (is_python_reward, reward_error_counts,
                                     reward_error_record)
from grpo_jax.rewards.device import device_reward_names, integer_answers, make_device_reward
from grpo_jax.rl.batch import rollout_record
from grpo_jax.rl.packing import pack_rows
from grpo_jax.rl.fused import make_fused_iterations
from grpo_jax.rl.rollout import Rollout, encode_prompts, tool_record
from grpo_jax.runner.checks import ConfigError
from grpo_jax.runner.inputs import train_examples
from grpo_jax.runner.rewards import LENGTH_REWARDS, resolve_reward_fns
from grpo_jax.runner.rl_loop import LoopSettings, StalenessError, check_versions
from grpo_jax.runner.rollouts import sample_batch, tool_episodes
from grpo_jax.runner.toolkit import StepTimer, device_batch, prompt_text
from grpo_jax.sampling import check_prompt_groups
from grpo_jax.tasks.base import Example


def _is_shape(x) -> bool:
    return isinstance(x, list) and len(x) == 2 and isinstance(x[1], str)


@dataclasses.dataclass
class Pending:
    """A rollout sampled ahead of its update."""

    step: int  # the update it is for
    rollout: Rollout  # its version stamped
    examples: list
    info: dict


class PendingRollouts:
    """The rollouts sampled ahead of their update (rl.max_staleness K > 0), in order.
    Checkpointed with the stage: each rollout's arrays (`Rollout.arrays`) in the
    checkpoint's state, the rest in its meta with the arrays' shapes and dtypes, from which
    the restore target is made; the texts are decoded again from the tokens."""

    def __init__(self):
        self.entries: list[Pending] = []

    def __len__(self):
        return len(self.entries)

    def tree(self) -> dict:
        """The arrays, a pytree for the checkpoint."""
        return {str(i): entry.rollout.arrays() for i, entry in enumerate(self.entries)}

    def meta(self) -> list:
        return [{"step": e.step, "examples": [ex.to_dict() for ex in e.examples],
                 "info": e.info,
                 "shapes": jax.tree.map(lambda x: [list(np.shape(x)), np.asarray(x).dtype.name],
                                        e.rollout.arrays())}
                for e in self.entries]

    @staticmethod
    def template(meta: list) -> dict:
        """Zero arrays of the shapes `meta` records (the checkpoint's restore target)."""
        return {str(i): jax.tree.map(lambda s: np.zeros(s[0], s[1]), record["shapes"],
                                     is_leaf=_is_shape)
                for i, record in enumerate(meta)}

    @classmethod
    def restore(cls, tree: dict, meta: list, tokenizer, example_type) -> PendingRollouts:
        pending = cls()
        for i, record in enumerate(meta):
            arrays = jax.tree.map(np.asarray, tree[str(i)])
            tokens, mask = arrays["tokens"], arrays["attention_mask"]
            texts = [tokenizer.decode(tokens[r][mask[r]].tolist()) for r in range(len(tokens))]
            pending.entries.append(Pending(
                record["step"], Rollout(**arrays, texts=texts),
                [example_type.from_dict(e) for e in record["examples"]], record["info"]))
        return pending


def collect(run, stage, iterator, step: int, *, settings: LoopSettings, sampling, reward_fns,
            episodes=None):
    """Starts one batch of N groups of G scored completions (N = num_prompts, G =
    group_size) for update `step`; returns finish() -> (rollout, examples, info dict).

    With settings.overlong_cache > 0 the soft overlong punishment (DAPO) is added to the
    rewards as the component "overlong" (weighted by the "overlong" reward weight, 1.0 if
    absent); with settings.dynamic_sampling, `dynamic_sampling`. Without dynamic sampling
    the sampler runs between the two calls; dynamic sampling needs each round's rewards to
    go on, so it runs here whole. The rollout has no version yet.
    """
    weights = settings.weights
    text_weights = {k: v for k, v in weights.items() if k not in LENGTH_REWARDS}
    policy, params = run.sampler()  # the run's, or its copy on mesh.rollout_devices

    def launch(batch_examples, rounds):
        key = jax.random.fold_in(run.stage_key(stage.name, step), rounds)
        if policy is not run.policy:  # the key, like the parameters, to the rollout devices
            key = jax.device_put(key, parallel.replicated_sharding(run.rollout_mesh))
        finish = sample_batch(
            run, policy, params, batch_examples, key, sampling=sampling,
            reward_fns=reward_fns, weights=text_weights, where=f"{stage.name} step {step + 1}",
            episodes=episodes, sharding=run.data_sharding if policy is run.policy else None)
        if settings.overlong_cache <= 0:
            return finish

        return lambda: with_overlong(finish(), settings)

    if settings.dynamic_sampling:
        result = dynamic_sampling(launch, iterator, settings)
        return lambda: result
    batch_examples = [ex for ex in next(iterator) for _ in range(settings.group_size)]
    finish = launch(batch_examples, 0)
    return lambda: (finish(), batch_examples, {"sampling_rounds": 1})


def with_overlong(ro: Rollout, settings: LoopSettings) -> Rollout:
    """The rollout with DAPO's soft overlong punishment of its lengths added to its rewards
    as the component "overlong" (weighted by the "overlong" reward weight, 1.0 if absent)."""
    penalty = overlong_penalty(ro.lengths, max_length=settings.max_new_tokens,
                               cache_length=settings.overlong_cache)
    return ro.replace(components={**ro.components, "overlong": penalty},
                      rewards=ro.rewards
                      + np.float32(settings.weights.get("overlong", 1.0)) * penalty)


def masked_rows(ro: Rollout, rows) -> Rollout:
    """Copies of `rows` that carry no loss (no attention, no reward): fillers that keep an
    update's compiled shape."""
    filler = ro.take_rows(rows)
    return filler.replace(attention_mask=np.zeros_like(filler.attention_mask),
                          loss_mask=np.zeros_like(filler.loss_mask),
                          rewards=np.zeros_like(filler.rewards))


def dynamic_sampling(launch, iterator, settings: LoopSettings):
    """DAPO's dynamic sampling: groups whose rewards are all equal (zero advantage, no
    gradient) are dropped and more prompts are sampled (`launch(examples, round)() ->
    Rollout`), for at most max_sampling_rounds rounds; if the batch is still short, the
    remaining groups are filled with fully masked rows (they carry no loss) so the update
    keeps its compiled shape. Returns (rollout, examples, info)."""
    n, g = settings.num_prompts, settings.group_size
    kept, kept_examples, rounds, dropped = [], [], 0, 0
    while True:
        batch_examples = [ex for ex in next(iterator) for _ in range(g)]
        ro = launch(batch_examples, rounds)()
        rounds += 1
        good = np.flatnonzero(ro.rewards.reshape(n, g).std(axis=1) > 0)
        dropped += n - len(good)
        have = sum(k.rows for k in kept) // g
        good = good[: n - have]
        if len(good):
            rows = (good[:, None] * g + np.arange(g)[None]).reshape(-1)
            kept.append(ro.take_rows(rows))
            kept_examples.extend(batch_examples[i] for i in rows)
        have += len(good)
        if have == n or rounds >= settings.max_sampling_rounds:
            break
    filled = n - have
    if filled:
        # Masked filler rows: copies of the last batch's first rows with no loss mask.
        kept.append(masked_rows(ro, np.arange(filled * g)))
        kept_examples.extend(batch_examples[: filled * g])
    merged = Rollout.concat(kept) if len(kept) > 1 else kept[0]
    return merged, kept_examples, {"sampling_rounds": rounds, "dropped_groups": dropped,
                                   "filled_groups": filled}


class Source:
    """A rollout source with nothing of its own to checkpoint and no limit (the defaults
    a source overrides)."""

    settings: LoopSettings

    @classmethod
    def check(cls, check, settings: LoopSettings) -> None:
        """ConfigError lines (via `check`) for the settings this source cannot run."""
        del check, settings

    def restore_target(self, resume_meta) -> dict:
        """Its checkpointed arrays' restore target ({}: none)."""
        del resume_meta
        return {}

    def restore(self, restored: dict, resume_meta) -> None:
        del restored, resume_meta

    def checkpoint(self, state: dict) -> tuple[dict, dict]:
        """(the learner's state with its own arrays, its checkpoint meta)."""
        return state, {}

    def steps(self, step: int, iterator, learner) -> list[dict]:
        """Runs one or more iterations from update `step`: their metrics lines."""
        raise NotImplementedError


class HostSource(Source):
    """One iteration per `steps` call, sampled and scored on the host.

    With max_staleness K > 0, update t trains on rollouts sampled for it by the parameters
    of version max(t - K, 0): each step samples for updates step .. step + K with the
    current parameters; on rollout devices of their own (mesh.rollout_devices) the ones for
    later updates finish after this update, which runs beside them. The queue is part of
    the stage's checkpoint.
    """

    def __init__(self, run, stage, settings: LoopSettings):
        self.run, self.stage, self.settings = run, stage, settings
        self.reward_fns = resolve_reward_fns(run, settings.weights, section=stage.section)
        self.sampling = settings.sampling(run)
        self.episodes = tool_episodes(run, settings, self.sampling)
        self.pending = PendingRollouts()
        self.ahead = 0  # the next update to sample for

    def restore_target(self, resume_meta) -> dict:
        saved = (resume_meta or {}).get("pending", [])
        return {"pending": PendingRollouts.template(saved)} if saved else {}

    def restore(self, restored: dict, resume_meta) -> None:
        if "pending" in restored:
            self.pending = PendingRollouts.restore(restored["pending"], resume_meta["pending"],
                                                   self.run.tokenizer, Example)
        self.ahead = int((resume_meta or {}).get("stage_step", 0)) + len(self.pending)

    def checkpoint(self, state: dict) -> tuple[dict, dict]:
        if not len(self.pending):
            return state, {}
        return {**state, "pending": self.pending.tree()}, {"pending": self.pending.meta()}

    def _launch(self, iterator, for_step: int, version: int):
        finish = collect(self.run, self.stage, iterator, for_step, settings=self.settings,
                         sampling=self.sampling, reward_fns=self.reward_fns,
                         episodes=self.episodes)

        def finished():
            ro, examples, info = finish()
            return Pending(for_step, ro.replace(version=np.full(ro.rows, version, np.int32)),
                           examples, info)

        return finished

    def _packed(self, batch):
        """(batch, whether it is packed): with pack_blocks, the batch's rows packed into
        that many blocks (rounded up to a multiple of the data devices) of P + N tokens, or
        the batch as it is when they do not fit (that step runs padded)."""
        blocks = self.settings.pack_blocks
        if not blocks:
            return batch, False
        devices = self.run.data_sharding.mesh.devices.size
        blocks = -(-blocks // devices) * devices
        packed = pack_rows(np.asarray(batch.tokens), np.asarray(batch.attention_mask),
                           batch.prompt_len, num_blocks=blocks,
                           block_len=batch.tokens.shape[1], pad_id=self.run.tokenizer.pad_id)
        return (batch, False) if packed is None else (batch.replace(packed=packed), True)

    def steps(self, step: int, iterator, learner) -> list[dict]:
        run, settings, pending = self.run, self.settings, self.pending
        timer = StepTimer()
        undecided, errors = undecided_comparisons(), reward_error_counts()
        launched = []
        while self.ahead <= min(step + settings.max_staleness, settings.steps - 1):
            launched.append((self.ahead, self._launch(iterator, self.ahead, version=step)))
            self.ahead += 1
        later = run.rollout_mesh is not None
        for for_step, finish in launched:
            if not later or for_step == step:
                pending.entries.append(finish())
        launched = [(s, f) for s, f in launched if later and s != step]
        entry = pending.entries.pop(0)
        if entry.step != step:
            raise StalenessError(f"update {step} was given the rollout sampled for update "
                                 f"{entry.step}")
        ro, info = entry.rollout, entry.info
        check_versions(ro.version, step, settings.max_staleness)
        check_prompt_groups(ro.prompt_tokens, ro.prompt_mask, settings.group_size)
        batch, packed = self._packed(ro.to_batch())
        batch = device_batch(run, batch)
        timer.lap("sample")
        metrics = learner.iterate(batch, step)
        if settings.pack_blocks:
            metrics["packed"] = float(packed)
        run.params = learner.state["params"]
        for _, finish in launched:  # sampled with the parameters before the update
            pending.entries.append(finish())
        timer.lap("update")
        return [self._line(ro, entry.examples, info, metrics, timer, (undecided, errors))]

    def _guarded(self) -> bool:
        """Whether a reward of the section runs behind the Python rewards' guard (a
        "module:function", or one the task names in `guarded_rewards`)."""
        task_guarded = getattr(self.run.task, "guarded_rewards", ())
        return any(is_python_reward(name) or name in task_guarded
                   for name in self.settings.weights)

    def _line(self, ro: Rollout, examples, info: dict, metrics: dict, timer: StepTimer,
              counters: tuple) -> dict:
        """The metrics line of an update that trained on `ro`: its rollout record, `info`,
        the tool record of episodes, the reward counters since `counters` (undecided
        comparisons; the Python rewards' guard counts, `reward_error_record`), the
        learner's metrics, the timings and the samples."""
        undecided, errors = counters
        rollout_metrics = rollout_record(ro.rewards, ro.components, ro.correct, ro.lengths,
                                         ro.truncated, group_size=self.settings.group_size)
        return {
            **{k: float(v) for k, v in jax.device_get(rollout_metrics).items()},
            **info,
            **(tool_record(ro) if ro.turns is not None else {}),
            "reward_undecided": float(undecided_comparisons() - undecided),
            **(reward_error_record(errors) if self._guarded() else {}),
            **metrics,
            **timer.record(),
            "samples": (examples, ro.texts, ro.rewards, ro.components),
        }


class DeviceSource(Source):
    """`fused_steps` = K iterations per `steps` call, all on device: one program
    (`rl.fused.make_fused_iterations`) samples, scores with the device rewards and runs the
    learner's `iteration` K times in a `lax.scan`, one host round trip per K.

    The prompts, their order and the sampling keys are the host source's; the checkpoints
    fall at chunk ends. The whole iteration is one program, so a line logs step_time_s (the
    chunk's time over its iterations) and compile_time_s, not a sample/update split.
    """

    # What the program cannot do, checked before stage 0 (`check`): each field must have
    # this value.
    NEEDS = (("num_iterations", 1), ("num_minibatches", 1), ("overlong_cache", 0),
             ("ref_reset_every", 0), ("max_staleness", 0))

    def __init__(self, run, stage, settings: LoopSettings, learner):
        if jax.process_count() > 1:
            raise ConfigError(f"{stage.name}.fused_steps: runs in one process only (this run "
                              f"has {jax.process_count()}); set it to 0")
        self.run, self.stage, self.settings = run, stage, settings
        self.chunk = settings.fused_steps
        rewards = {name: make_device_reward(name, run.tokenizer) for name in settings.weights}
        self.program = make_fused_iterations(
            run.policy, learner.step, group_size=settings.group_size,
            sampling=settings.sampling(run), rewards=rewards, weights=settings.weights)

    @classmethod
    def check(cls, check, settings: LoopSettings) -> None:
        """ConfigError lines (naming fused_steps) for what a device program cannot do."""
        section, k = check.section, settings.fused_steps
        if settings.tools:
            check.fail("fused_steps", f"multi-turn episodes (tools {settings.tools!r}) need "
                                      "the host between turns: set fused_steps to 0")
        for field in ("steps", "checkpoint_every"):
            if section[field] % k:
                check.fail("fused_steps", f"{field} {section[field]} is not a multiple of "
                                          f"fused_steps {k} (a program runs {k} iterations)")
        for field, allowed in cls.NEEDS:
            if field in section and section[field] != allowed:
                check.fail("fused_steps", f"needs {field} = {allowed}, got {section[field]}")
        if settings.dynamic_sampling:
            check.fail("fused_steps", "needs dynamic_sampling = off (it resamples on the host)")
        if check.config.mesh.get("rollout_devices", 0):
            check.fail("fused_steps", "samples and trains in one program on one mesh: set "
                                      "mesh.rollout_devices to 0 or fused_steps to 0")
        missing = [name for name in settings.weights if name not in device_reward_names()]
        if missing:
            check.fail("fused_steps", f"reward {missing[0]!r} has no device version; device "
                                      f"rewards: {device_reward_names()}")
        if check.tokenizer is not None:  # a workdir-trained tokenizer is checked in the Run
            for name in settings.weights:
                try:
                    make_device_reward(name, check.tokenizer)
                except ValueError as err:
                    check.fail("fused_steps", str(err))
        try:  # the training problems the program scores (too few is task.train_size's line)
            examples = train_examples(check.config, check.task)
        except ValueError:
            return
        try:
            integer_answers(examples)
        except ValueError as err:
            check.fail("fused_steps", f"{err}; set fused_steps to 0 (the host scores any "
                                      "answer)")

    def _answers(self, examples):
        try:
            return integer_answers(examples)
        except ValueError as err:
            raise ConfigError(f"{self.stage.name}.fused_steps: {err}") from None

    def steps(self, first: int, iterator, learner) -> list[dict]:
        run, stage, g, chunk = self.run, self.stage, self.settings.group_size, self.chunk
        timer = StepTimer()
        tokens, masks, answers = [], [], []
        for _ in range(chunk):
            examples = [ex for ex in next(iterator) for _ in range(g)]
            prompt, mask = encode_prompts(run.tokenizer,
                                          [prompt_text(run, ex) for ex in examples],
                                          prompt_len=run.config.task.prompt_len,
                                          ids=[ex.id for ex in examples])
            check_prompt_groups(prompt, mask, g)  # the program runs each prompt once
            tokens.append(prompt), masks.append(mask), answers.append(self._answers(examples))
        keys = jnp.stack([jax.random.fold_in(run.stage_key(stage.name, step), 0)
                          for step in range(first, first + chunk)])
        spec = run.data_sharding.spec
        rows = jax.sharding.NamedSharding(run.mesh, jax.sharding.PartitionSpec(None, *spec))
        inputs = jax.device_put((np.stack(tokens), np.stack(masks), np.stack(answers)), rows)
        versions = jnp.arange(first, first + chunk, dtype=jnp.int32)
        learner.state, metrics = self.program(learner.state, *inputs, keys, versions)
        metrics = jax.device_get(metrics)
        times = timer.record()
        return [{**{k: float(v[i]) for k, v in metrics.items()},
                 "sampling_rounds": 1,
                 "step_time_s": times["step_time_s"] / chunk,
                 "compile_time_s": times["compile_time_s"] if i == 0 else 0.0}
                for i in range(chunk)]
