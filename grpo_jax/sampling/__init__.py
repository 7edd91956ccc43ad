"""On-device sampling: prefill + `lax.while_loop` decode over a pytree KV cache, and
multi-turn episodes that continue from the cache after each tool answer."""

from grpo_jax.sampling.episodes import (EpisodeConfig, EpisodeOutput, episode_rows,
                                        episode_texts, generate_episodes)
from grpo_jax.sampling.sampler import (SampleOutput, SamplingConfig, check_prompt_groups, generate,
                                      pad_prompts)

__all__ = ["EpisodeConfig", "EpisodeOutput", "SampleOutput", "SamplingConfig",
           "check_prompt_groups", "episode_rows", "episode_texts", "generate",
           "generate_episodes", "pad_prompts"]
