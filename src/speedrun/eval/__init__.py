"""Diversity evaluation: metrics (diversity), paired bootstrap comparison (compare), report.md + figures (report)."""
