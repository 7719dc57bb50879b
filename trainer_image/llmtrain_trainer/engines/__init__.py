"""The training strategies behind ``base.Engine``: plain DDP (``ddp.py``) and DeepSpeed
ZeRO (``deepspeed.py``), chosen once by ``select.py``; and what they train on: the model,
the data, the learning-rate schedule, the RNG state."""
