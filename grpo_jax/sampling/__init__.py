"""On-device sampling: prefill + `lax.while_loop` decode over a pytree KV cache."""

from grpo_jax.sampling.sampler import SampleOutput, SamplingConfig, generate, pad_prompts

__all__ = ["SampleOutput", "SamplingConfig", "generate", "pad_prompts"]
