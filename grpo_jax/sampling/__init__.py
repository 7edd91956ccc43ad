"""On-device sampling: prefill + `lax.while_loop` decode over a pytree KV cache."""

from grpo_jax.sampling.sampler import (SampleOutput, SamplingConfig, check_prompt_groups, generate,
                                      pad_prompts)

__all__ = ["SampleOutput", "SamplingConfig", "check_prompt_groups", "generate", "pad_prompts"]
