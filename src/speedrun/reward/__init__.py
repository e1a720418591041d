"""Reward models: preference.py (Bradley-Terry RM on chosen/rejected pairs) and discriminator.py (adversarial)."""
