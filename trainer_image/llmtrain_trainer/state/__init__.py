"""The training state's formats, in memory (``arena``: named tensors laid out as a
checkpoint file's payload) and on disk (``tensorio``: those files, hashed as written).
Engines keep their state in them and the checkpoint store writes and reads them; neither
side owns them, so the engines meet checkpointing only through ``checkpoint.protocol``."""
