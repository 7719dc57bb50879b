"""llmtrain trainer: an elastic DeepSpeed/DDP trainer run under torchrun.

Nothing here imports torch at package import time: the launcher and the rendezvous
store start fast, and a bad config fails before torch loads. What the operator shares
with the trainer (the config model, the exit codes, the command lines, the names) lives
in ``llmtrain_contract``.
"""

__version__ = "0.1.0"
