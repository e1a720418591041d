"""GRPO (grpo.py) and density-aware prompt sampling (density.py)."""
