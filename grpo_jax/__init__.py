"""grpo_jax: RL for language models on verifiable rewards, in JAX."""

__version__ = "0.1.0"
