"""Regenerate trainer_image/llmtrain_trainer/engines/shards/tiny_shard.bin (committed).

A small nanoGPT-style shard for tests and examples: the UTF-8 bytes of the project's
own Markdown and Python sources (byte-level tokens, vocabulary 256), stored as uint16.
Select it in a job with ``data: {source: shards, path: "builtin:tiny"}``.
"""

import json
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parents[1]
files = sorted(root.glob("docs/*.md")) + [root / "README.md"] + sorted(root.glob("trainer_image/llmtrain_trainer/**/*.py"))
blob = b"\n".join(f.read_bytes() for f in files)
tokens = np.frombuffer(blob, dtype=np.uint8).astype(np.uint16)
out = root / "trainer_image" / "llmtrain_trainer" / "engines" / "shards" / "tiny_shard.bin"
tokens.tofile(out)
meta = {"tokens": int(tokens.size), "vocab_size": 256, "encoding": "utf-8 bytes", "sources": [str(f.relative_to(root)) for f in files]}
out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
print(f"wrote {out} ({tokens.size} tokens)")
