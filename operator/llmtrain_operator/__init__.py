"""llmtrain-operator: a Kubernetes operator for elastic LLM training.

Layers, top to bottom (enforced by import-linter, see ``.importlinter``):
``cli`` > ``handlers`` | ``localrun`` > ``planner`` > ``k8s`` | ``metrics`` | ``settings`` > ``api``.
"""

__version__ = "0.1.0"
