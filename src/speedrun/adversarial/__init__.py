"""The adversarial cycle: mixed natural/generated windows (data.py), the GRPO reward and prompts (reward.py),
per-cycle evaluation and the report section (evaluate.py). The discriminator lives in speedrun.reward."""
