"""What every study shares, the face a study author imports (`from grpo_jax.studies import
common`), over small modules by job: the study record and claims (`record`), its configs
(`configs`), planning, running and measuring its runs (`runs`), publishing its outputs
(`publish`), what the analyses read from finished runs (`arms`) and their tables and plots
(`present`).

A study module defines `STUDY = Study(...)`:

- `base_config(tier)`: the config of one pretrained base (its seed is set per base), or None
  for a study without one; or {role: config, or a function of the {role: workdir} built
  before it returning a config, or None when the role is not to be built} for a study
  whose arms start from several runs (a student and a teacher; rounds of pretraining). A
  base is a run in `<workdir>/bases/<key>/`, keyed by the hash of its resolved config (seed
  included): every study asking for the same config reuses it, a different config never
  does.
- `arm_configs(tier)`: {arm name: config}; each runs once per (base, seed) in
  `<workdir>/runs/<hash of its resolved config>/` (linked from
  `<workdir>/<study>/runs/<arm>/<base key>,seed=<s>`: two studies asking for the same run
  share it) with `config.seed = s` and, with a base,
  `config.model.init_from` set to the base's directory (or `attach(config, base)` wiring the
  roles' directories, `base["roles"]`, into it). Arms of one (base, seed) share the
  prompt order, sampling keys and held-out problems: they are paired.
- `analyze(runs) -> Analysis`: per-seed metrics per arm, the contrasts (a, b, metric), the
  study's own table and plots. The summary, contrast table and README block are generated
  from it (`grpo_jax.studies.summary`).
- `claims`: what the study tests (`summary.Claim`: the claim as its source states it, the
  contrast that tests it and what it predicts), fixed before the runs; each verdict follows
  from its contrast by one rule (`summary.verdict_of`).
- `measure(runs)` (optional): post-hoc measurements on the finished runs, written into each
  run's directory (resumable: a finished measurement is skipped).

A run whose report.json exists is finished and skipped, so the same command resumes.
"""

from __future__ import annotations

from grpo_jax.studies.arms import (ArmRows, add_base_arm, arm_curves, constant_arm, eval_seed,
                                   eval_values, figures, last_stage_rows, load_finished,
                                   load_run_params, measured_arm, per_seed, training_mean,
                                   training_rows)
from grpo_jax.studies.configs import (VOLATILE_FIELDS, agents_job, config_hash, for_tier,
                                      for_tier_base, main_arm, main_base, main_job, preset,
                                      tool_job)
from grpo_jax.studies.present import (band, bar_plot, cell, curve_panels, error_bars,
                                      interval_line, k_axis, paired_cell, pyplot,
                                      save_figure)
from grpo_jax.studies.publish import (experiments_dir, generated_block, index_table,
                                      publish_outputs, write_outputs)
from grpo_jax.studies.record import (POST_HOC_MARGIN, Analysis, Claim, RunRecord, Study,
                                     StudyRuns, Tier)
from grpo_jax.studies.runs import (RunHeld, build_base, build_bases, execute, holder_of,
                                   link_run, plan, protocol_of)

__all__ = ["POST_HOC_MARGIN", "VOLATILE_FIELDS", "Analysis", "ArmRows", "Claim", "RunHeld",
           "RunRecord", "Study", "StudyRuns", "Tier", "add_base_arm", "agents_job",
           "arm_curves", "band", "bar_plot", "build_base", "build_bases", "cell",
           "config_hash", "constant_arm", "curve_panels", "error_bars", "eval_seed",
           "eval_values", "execute", "experiments_dir", "figures", "for_tier", "for_tier_base",
           "generated_block", "holder_of", "index_table", "interval_line", "k_axis",
           "last_stage_rows", "link_run", "load_finished", "load_run_params", "main_arm",
           "main_base", "main_job", "measured_arm", "paired_cell", "per_seed", "plan",
           "preset", "protocol_of", "publish_outputs", "pyplot", "save_figure", "tool_job",
           "training_mean", "training_rows", "write_outputs"]
