"""Run an LLMTrainJob on this machine with torchrun, no cluster."""
