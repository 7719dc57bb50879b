"""llmtrain trainer: an elastic DeepSpeed/DDP trainer run under torchrun.

Nothing here imports torch at package import time: the operator imports
``llmtrain_trainer.config`` and ``llmtrain_trainer.exitcodes`` without torch installed.
"""

__version__ = "0.1.0"
