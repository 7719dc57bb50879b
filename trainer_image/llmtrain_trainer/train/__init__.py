"""The rank's program: what each process torchrun starts runs.

``main.py`` is the entry (config, process group, exit codes); ``loop.py`` the training
loop, top to bottom, calling small units: ``resume.py`` (the agreed restore point),
``agreement.py`` (the per-step all-reduce), ``rescue.py`` (rescue checkpoints),
``numerics.py``, ``stragglers.py``, ``watchdog.py``, ``metrics.py``, ``steplog.py``.
``script.py`` is the same rank's program for a user's own training script.
"""
