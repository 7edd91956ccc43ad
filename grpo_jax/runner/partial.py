"""Partial rollouts: a step decodes every unfinished row for at most `rl.partial_tokens`
tokens, and a row not finished is carried into the next step and continued there with the
newer parameters (Kimi k1.5, https://arxiv.org/abs/2501.12599, section 2.6.2), so a step
does not wait for its longest rows.

The source keeps a pool of N groups (num_prompts) of G rows in flight. Each step:

1. empty group places take the next prompts;
2. one round: every unfinished row is continued from its prompt and the tokens it has so
   far (prefilled again under the current parameters: the KV cache of older parameters is
   not the current policy's), for at most partial_tokens new tokens; a row whose first
   token (or its group's oldest) would be older than rl.max_staleness at the next update
   is decoded to its end instead (the round then runs the whole budget for every row); another round runs if no
   group is done yet;
3. the groups whose rows are all done are scored and trained on; the batch's other groups
   are masked fillers (no loss, as dynamic sampling fills a short batch);
4. what is left in flight is part of the stage's checkpoint, so a killed run resumes
   bit-exactly with its unfinished rows.

Every token keeps the log-prob it was sampled with and the parameter version that sampled
it (`Rollout.version` [B, N]); the learner's off-policy correction (rl.off_policy_correction)
is per token already, and the staleness bound is checked per token.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from grpo_jax.rewards.accuracy import undecided_comparisons
from grpo_jax.rewards.python import reward_error_counts
from grpo_jax.rl.rollout import Rollout, encode_prompts, score_completions
from grpo_jax.runner.rewards import LENGTH_REWARDS
from grpo_jax.runner.rl_loop import check_versions
from grpo_jax.runner.sources import HostSource, masked_rows, with_overlong
from grpo_jax.runner.toolkit import StepTimer, device_batch, prompt_text
from grpo_jax.sampling import generate
from grpo_jax.tasks.base import Example

# the pool's arrays: name -> (dims in (rows R, prompt P, completion N), dtype)
POOL_ARRAYS = {"prompt_tokens": ("RP", "int32"), "prompt_mask": ("RP", "bool"),
               "tokens": ("RN", "int32"), "logp": ("RN", "float32"),
               "version": ("RN", "int32"), "written": ("R", "int32"),
               "ended": ("R", "bool")}


def continuation_prompts(prompt_tokens, prompt_mask, tokens, written, pad_id: int):
    """Each row's prompt followed by its first `written` completion tokens, left-padded into
    [R, P + N] (the sampler's prompt layout: a row's last token in the last column).

    Positions follow the mask (`models.default_positions`), so the continued row sees the
    positions the learner's pass over [prompt | completion] gives it.
    """
    rows, p = prompt_tokens.shape
    n = tokens.shape[1]
    out = np.full((rows, p + n), pad_id, np.int32)
    mask = np.zeros((rows, p + n), bool)
    for r in range(rows):
        ids = np.concatenate([prompt_tokens[r][prompt_mask[r]], tokens[r, :written[r]]])
        out[r, p + n - len(ids):] = ids
        mask[r, p + n - len(ids):] = True
    return out, mask


def host_source(run, stage, settings) -> HostSource:
    """The host source of a stage: with partial_tokens, the partial-rollout one."""
    return (PartialSource if settings.partial_tokens else HostSource)(run, stage, settings)


class PartialSource(HostSource):
    """The host source with partial rollouts (rl.partial_tokens T > 0): see the module."""

    # What partial rollouts cannot do, checked before stage 0 (`check`): each field must
    # have this value, for the reason given.
    NEEDS = (("tools", "", "multi-turn episodes are not continued across updates"),
             ("fused_steps", 0, "rows are carried on the host"))

    @classmethod
    def check(cls, check, settings) -> None:
        """ConfigError lines (naming partial_tokens) for what partial rollouts cannot do,
        run by the kind's validate (as `DeviceSource.check` is)."""
        section = check.section
        if settings.max_staleness < 1:
            check.fail("partial_tokens", "a carried row's tokens are at least one update "
                                         "old: set max_staleness >= 1 (the bound on any "
                                         "token's age) or partial_tokens = 0")
        for field, off, why in cls.NEEDS:
            if section.get(field, off) != off:
                check.fail("partial_tokens", f"{why}: set {field} = {off!r} or "
                                             "partial_tokens = 0")
        if check.config.mesh.get("rollout_devices", 0):
            check.fail("partial_tokens", "rows are continued on the trainer's devices: set "
                                         "mesh.rollout_devices = 0 or partial_tokens = 0")
        if settings.dynamic_sampling:
            check.fail("partial_tokens", f"dynamic sampling "
                                         f"({section.get('algorithm', section.kind)}) "
                                         "resamples whole groups within an update: set "
                                         "dynamic_sampling = off or partial_tokens = 0")

    def __init__(self, run, stage, settings):
        super().__init__(run, stage, settings)
        n, g = settings.num_prompts, settings.group_size
        self.rows = n * g
        self.prompt_len = run.config.task.prompt_len
        self.pool = self._empty_pool()
        self.examples: list[Example | None] = [None] * n  # each group place's problem
        self.queue: list[Example] = []  # prompts drawn from the iterator, not yet placed
        # Continuations prefill every row's own prefix (no shared prompt groups).
        self.round_sampling = {
            limit: dataclasses.replace(self.sampling, prompt_group=1, max_new_tokens=limit)
            for limit in (settings.partial_tokens, settings.max_new_tokens)}

    def _empty_pool(self) -> dict:
        size = {"R": self.rows, "P": self.prompt_len, "N": self.settings.max_new_tokens}
        return {name: np.zeros([size[d] for d in dims], dtype)
                for name, (dims, dtype) in POOL_ARRAYS.items()}

    # ---------------------------------------------------------------- checkpoint
    def restore_target(self, resume_meta) -> dict:
        return {"partial": self._empty_pool()} if (resume_meta or {}).get("partial") else {}

    def restore(self, restored: dict, resume_meta) -> None:
        if "partial" in restored:
            self.pool = {k: np.asarray(v) for k, v in restored["partial"].items()}
            saved = resume_meta["partial"]
            self.examples = [None if e is None else Example.from_dict(e)
                             for e in saved["examples"]]
            self.queue = [Example.from_dict(e) for e in saved["queue"]]

    def checkpoint(self, state: dict) -> tuple[dict, dict]:
        meta = {"examples": [None if e is None else e.to_dict() for e in self.examples],
                "queue": [e.to_dict() for e in self.queue]}
        return {**state, "partial": dict(self.pool)}, {"partial": meta}

    # ---------------------------------------------------------------- sampling
    def _place(self, iterator) -> int:
        """Empty group places take the next prompts; returns how many did."""
        g, pool = self.settings.group_size, self.pool
        placed = 0
        for place, example in enumerate(self.examples):
            if example is not None:
                continue
            if not self.queue:
                self.queue = list(next(iterator))
            example = self.examples[place] = self.queue.pop(0)
            tokens, mask = encode_prompts(self.run.tokenizer, [prompt_text(self.run, example)],
                                          prompt_len=self.prompt_len, ids=[example.id])
            rows = slice(place * g, (place + 1) * g)
            pool["prompt_tokens"][rows], pool["prompt_mask"][rows] = tokens, mask
            for name in ("tokens", "logp", "version", "written", "ended"):
                pool[name][rows] = 0
            pool["tokens"][rows] = self.run.tokenizer.pad_id
            placed += 1
        return placed

    def _round(self, step: int, round_: int) -> None:
        """Continues every unfinished row: partial_tokens new tokens, or to the end when a
        row's first token would otherwise pass the staleness bound at the next update."""
        settings, pool = self.settings, self.pool
        n = settings.max_new_tokens
        g = settings.group_size
        open_ = ~pool["ended"]
        # a group trains when its last row ends: its oldest token is its rows' oldest
        first = np.where(pool["written"] > 0, pool["version"][:, 0], step)
        oldest = first.reshape(-1, g).min(axis=1)
        must_end = open_.reshape(-1, g).any(axis=1) & (step + 1 - oldest
                                                       > settings.max_staleness)
        limit = n if must_end.any() else settings.partial_tokens
        prompts, mask = continuation_prompts(pool["prompt_tokens"], pool["prompt_mask"],
                                             pool["tokens"], pool["written"],
                                             self.run.tokenizer.pad_id)
        policy, params = self.run.sampler()
        key = jax.random.fold_in(self.run.stage_key(self.stage.name, step), round_)
        out = jax.device_get(generate(policy.graphdef, policy.state(params), prompts, mask, key,
                                      config=self.round_sampling[limit]))
        new, logp = np.asarray(out.tokens), np.asarray(out.logp, np.float32)
        lengths = np.asarray(out.lengths)
        if not np.isfinite(np.where(np.asarray(out.mask, bool), logp, 0.0)).all():
            raise FloatingPointError(f"{self.stage.name} step {step + 1}: the sampler's logits "
                                     "are not finite")
        eos = np.asarray(self.sampling.eos_ids)
        for r in np.flatnonzero(open_):
            w = int(pool["written"][r])
            take = min(int(lengths[r]), n - w)
            pool["tokens"][r, w:w + take] = new[r, :take]
            pool["logp"][r, w:w + take] = logp[r, :take]
            pool["version"][r, w:w + take] = step
            pool["written"][r] = w + take
            pool["ended"][r] = bool(np.isin(new[r, :take], eos).any()) or w + take >= n

    # ---------------------------------------------------------------- a step
    def _rollout(self, groups, step: int) -> tuple[Rollout, dict]:
        """The batch of update `step`: the done `groups`' rows scored, then masked fillers
        (copies of the first done group) up to num_prompts groups; with the real rows'
        count."""
        settings, pool, g = self.settings, self.pool, self.settings.group_size
        rows = np.concatenate([np.arange(place * g, (place + 1) * g) for place in groups])
        n = settings.max_new_tokens
        written = pool["written"][rows]
        attention = np.arange(n)[None] < written[:, None]
        tokens = np.where(attention, pool["tokens"][rows], self.run.tokenizer.pad_id)
        texts = [self.run.tokenizer.decode(tokens[i, :written[i]].tolist())
                 for i in range(len(rows))]
        examples = [self.examples[place] for place in groups for _ in range(g)]
        weights = {k: v for k, v in settings.weights.items() if k not in LENGTH_REWARDS}
        rewards, components = score_completions(texts, examples, self.reward_fns, weights)
        eos = np.isin(tokens, np.asarray(self.sampling.eos_ids)) & attention
        ro = Rollout(prompt_tokens=pool["prompt_tokens"][rows],
                     prompt_mask=pool["prompt_mask"][rows], tokens=tokens,
                     attention_mask=attention, loss_mask=attention,
                     behaviour_logp=np.where(attention, pool["logp"][rows], 0.0),
                     rewards=rewards, components=components, lengths=written.astype(np.int32),
                     truncated=~eos.any(axis=1),
                     # a column nobody wrote carries the update's own version (never used)
                     version=np.where(attention, pool["version"][rows], step).astype(np.int32),
                     texts=texts)
        if settings.overlong_cache > 0:
            ro = with_overlong(ro, settings)
        real = ro
        filled = settings.num_prompts - len(groups)
        if filled:
            ro = Rollout.concat([ro, masked_rows(ro, np.tile(np.arange(g), filled))])
        return ro, {"real": real, "examples": examples, "filled_groups": filled}

    def steps(self, step: int, iterator, learner) -> list[dict]:
        settings, g = self.settings, self.settings.group_size
        timer = StepTimer()
        undecided, errors = undecided_comparisons(), reward_error_counts()
        placed = self._place(iterator)
        carried = int((~self.pool["ended"]).sum()) - placed * g
        rounds = 0
        while True:
            self._round(step, rounds)
            rounds += 1
            done = [place for place in range(settings.num_prompts)
                    if self.pool["ended"][place * g:(place + 1) * g].all()]
            if done:
                break
        ro, info = self._rollout(done, step)
        real = info["real"]
        check_versions(ro.version[ro.loss_mask], step, settings.max_staleness)
        for place in done:
            self.examples[place] = None
        in_flight = int((~self.pool["ended"]).sum())
        batch, packed = self._packed(ro.to_batch())
        batch = device_batch(self.run, batch)
        timer.lap("sample")
        metrics = learner.iterate(batch, step)
        if settings.pack_blocks:
            metrics["packed"] = float(packed)
        self.run.params = learner.state["params"]
        timer.lap("update")
        versions = real.version[real.loss_mask]
        spread = np.where(real.loss_mask, real.version, -1).max(1) \
            - np.where(real.loss_mask, real.version, step + 1).min(1)
        partial = {
            "partial_rounds": float(rounds),
            "filled_groups": float(info["filled_groups"]),
            # rows continued from an earlier step, and rows left unfinished for the next
            "carried_rows": float(carried),
            "in_flight_rows": float(in_flight),
            "staleness_max": float(step - versions.min()) if versions.size else 0.0,
            # trained rows whose tokens several parameter versions sampled
            "multi_version_frac": float(np.mean(spread > 0)),
        }
        return [self._line(real, info["examples"], partial, metrics, timer,
                           (undecided, errors))]
