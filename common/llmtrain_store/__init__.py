"""The checkpoint store, torch-free: the tensor archive format, manifests and the checks
they pass, directory and S3 tiers, and what a tier's failure means.

The trainer writes and reads checkpoints through it; ``llmtrain checkpoints`` lists,
verifies and prunes them through it, on a machine without torch. It never imports the
operator or the trainer (an import-linter contract checks it).
"""
