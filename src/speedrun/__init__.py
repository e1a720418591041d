"""speedrun: a small, reproducible LLM post-training lab run as a DVC pipeline."""
