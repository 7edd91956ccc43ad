"""One run of the on-policy distillation study (grpo_jax/studies/onpolicy_distill.py): the
student in --config.model.init_from, the teacher's run in
--config.onpolicy_distill.teacher. The study itself: `python -m grpo_jax.studies run
onpolicy_distill`."""

from grpo_jax.studies.onpolicy_distill import OPD, arm_config


def get_config(preset=None):
    del preset
    return arm_config("full", OPD)
