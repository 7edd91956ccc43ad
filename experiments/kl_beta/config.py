"""One run of the kl_beta study (grpo_jax/studies/kl_beta.py): GRPO's default β unless
--config.rl.beta says otherwise, from the base in --config.model.init_from. The study itself:
`python -m grpo_jax.studies run kl_beta`."""

from grpo_jax.studies.kl_beta import arm_config


def get_config(preset=None):
    del preset
    return arm_config("full")
