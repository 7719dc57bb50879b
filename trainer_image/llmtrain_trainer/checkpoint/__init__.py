"""Tiered checkpoints: directory tiers with a commit protocol, async saves, and a
restore that agrees across ranks on the newest step every rank can load."""
