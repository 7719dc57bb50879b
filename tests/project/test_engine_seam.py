"""The engines meet checkpointing only in ``checkpoint.protocol``: the import contract
that says so names every other module of ``checkpoint/`` (a new one is covered too)."""

from __future__ import annotations

import configparser

from support.specs import ROOT


def test_the_contract_forbids_every_checkpoint_module_but_the_protocol():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = config["importlinter:contract:trainer-engines-meet-checkpointing-in-the-protocol"]
    forbidden = {m.strip() for m in contract["forbidden_modules"].split() if m.strip()}
    modules = {f"llmtrain_trainer.checkpoint.{p.stem}" for p in (ROOT / "trainer_image" / "llmtrain_trainer" / "checkpoint").glob("*.py")
               if p.stem not in ("__init__", "protocol")}
    assert forbidden == modules
    assert contract["source_modules"].split() == ["llmtrain_trainer.engines"]
