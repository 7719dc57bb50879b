"""What the operator and the trainer share: the trainer config model and its base type,
the exit-code table, the command lines of the store, launcher and torchrun, and every
name both sides must agree on (``names``).

Import-light (pydantic and the standard library only): the operator image has no torch,
and the trainer image has no Kubernetes client; both install this package. It is the
only trainer-side code the operator imports (an import-linter contract checks it).
"""
