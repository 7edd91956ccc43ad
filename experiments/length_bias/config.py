"""Length bias of GRPO's normalisations (and response-length growth) on arithmetic with redos.

The main job's RL stage (configs/default.py: accuracy + 0.2 x format reward, lr 2e-4,
groups of 8, host rewards) from the final parameters of one shared base run pretrained on
traces where each step is redone with probability 0.3 (task.kwargs.redo_rate: a redone step
is always right, so longer traces are more often right), 120 steps of 16 prompts, with the
held-out evaluation before and after on problems fixed across seeds (task.eval_seed). KL is
off (rl.beta 0) in both arms, so "grpo" and "dr_grpo" differ only in the advantage's std
scaling and the length normalisation. The sweep sets rl.algorithm and the seed; see
README.md next to this file (and ../length_growth/README.md) for the commands.
"""


from grpo_jax.config_presets import main_job

MAX_NEW_TOKENS = 48  # a trace with two redone steps is ~37 tokens; 16 + 48 = max_seq_len 64


def get_config(preset=None):
    del preset
    config = main_job()
    config.stages = "eval_base,rl,eval_final"
    del config.pretrain
    config.task.kwargs.redo_rate = 0.3  # as the base was pretrained
    config.rl.steps = 120
    config.rl.num_prompts = 16
    config.rl.beta = 0.0  # no KL term in either arm: the arms differ in normalisation only
    config.rl.max_new_tokens = MAX_NEW_TOKENS
    config.rl.fused_steps = 0  # host loop (dr_grpo's aggregation, completions up to 48)
    # Every 20th step's parameters are kept, so the held-out redo rate can be measured
    # along training (length_bias/held_out.py).
    config.rl.checkpoint_every = 20
    config.checkpoint.max_to_keep = 10
    for section in (config.eval_base, config.eval_final):
        section.max_new_tokens = MAX_NEW_TOKENS
    # The base run's workdir (its final parameters, model shape and tokenizer); the sweep
    # passes it with --config.model.init_from=...
    config.model.init_from = ""
    return config
