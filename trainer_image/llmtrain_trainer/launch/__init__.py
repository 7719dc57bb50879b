"""The launcher side of a worker pod: the processes around the ranks.

PID 1 (``launcher.py``) runs torchrun's agent (``torchrun_agent.py``) and the pod's fork
server (``zygote.py``), watches every rank from outside (``supervisor.py``: heartbeats,
stacks, victims), keeps the pod's rendezvous lease, and reports why the pod stopped
(``attempts.py``, the termination message). ``bundle.py`` copies it into a user's image.
It never imports the rank side: what the two exchange is in ``pod/``.
"""
