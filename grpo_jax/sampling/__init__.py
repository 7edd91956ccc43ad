"""On-device sampling: one decode core (`sampling.decode`: prefill, then one
`lax.while_loop` over a pytree KV cache) run without pauses by `generate` and with host
hand-offs by `generate_episodes` (multi-turn episodes continuing from the cache after each
tool answer); token choice in `sampling.choice`."""

from grpo_jax.sampling.episodes import (EpisodeConfig, EpisodeOutput, episode_rows,
                                        episode_texts, generate_episodes)
from grpo_jax.sampling.sampler import (SampleOutput, SamplingConfig, check_prompt_groups, generate,
                                      pad_prompts)

__all__ = ["EpisodeConfig", "EpisodeOutput", "SampleOutput", "SamplingConfig",
           "check_prompt_groups", "episode_rows", "episode_texts", "generate",
           "generate_episodes", "pad_prompts"]
