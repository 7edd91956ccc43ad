"""One arm of the distill_vs_rl study (grpo_jax/studies/distill_vs_rl.py): `config.py:rl`
(GRPO on the student) or `config.py:distill` (distillation from the teacher), from the
student in --config.model.init_from (and, to distill, --config.distill.student_init_from and
--config.distill.teacher). The study itself: `python -m grpo_jax.studies run distill_vs_rl`."""

from grpo_jax.studies.distill_vs_rl import arm_config


def get_config(preset=None):
    if preset not in ("rl", "distill"):
        raise ValueError(f"experiments/distill_vs_rl/config.py needs a preset: rl or distill, "
                         f"got {preset!r}")
    return arm_config("full", preset)
