"""Continued pretraining and the controlled contamination experiments (see the issues; not yet built)."""
