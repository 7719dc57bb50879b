"""Pure planning: (job, observed state, clock) -> actions. No I/O."""
