"""The S3 tier against a real S3 server (MinIO on loopback, built from its Go module):
balanced shares uploaded and pulled back in parallel, verified; failures classified
without leaking credentials."""

from __future__ import annotations

import logging
import os

import pytest
from llmtrain_store import manifest as mf
from llmtrain_store.health import classify
from llmtrain_store.s3 import S3Tier
from llmtrain_store.tier import CheckpointError

from store.helpers import ALLOWED, save_shared

PIECE = 1 << 20


@pytest.fixture
def s3env(minio, monkeypatch):
    for key, value in minio.env().items():
        monkeypatch.setenv(key, value)
    return minio


def _tier(prefix: str, **kw) -> S3Tier:
    return S3Tier("s3", f"s3://ckpt/{prefix}", **kw)


@pytest.mark.tools  # MinIO (the minio fixture)
def test_shares_go_up_as_one_copy_and_come_back_byte_for_byte(s3env, tmp_path):
    state = os.urandom(5 * PIECE + 77)
    tier = _tier("roundtrip", keep=2)
    committed = save_shared(tier, 30, state, nodes=2, piece=PIECE)
    keys = s3env.keys("ckpt", "roundtrip/step-00000030/")
    parts = [k for k in keys if ".part-" in k]
    assert sum(keys[k] for k in parts) == len(state), "the replicated file is stored once per job"
    assert not any("/parts/" in k for k in keys), "part records are removed once the manifest holds them"
    listed = tier.list()
    assert [c.step for c in listed] == [30]
    assert tier.verify(listed[0], None, ALLOWED) is None
    tier.fetch(committed, ["state.llmt", "rng/rank-00001.llmt"], tmp_path / "pulled", ALLOWED)
    assert (tmp_path / "pulled" / "state.llmt").read_bytes() == state


@pytest.mark.tools  # MinIO (the minio fixture)
def test_retention_keeps_the_newest_and_sweeps_abandoned_uploads(s3env):
    tier = _tier("retain", keep=2)
    for step in (1, 2, 3):
        save_shared(tier, step, os.urandom(1000), nodes=1, piece=PIECE)
    tier.write_part(4, 0, {"files": {}})  # an upload that never committed...
    save_shared(tier, 5, os.urandom(1000), nodes=1, piece=PIECE)  # ...older than a newer commit
    assert tier.retain() == [1, 2, 4]
    assert [c.step for c in tier.list()] == [5, 3]
    assert not any(k.startswith("retain/step-00000004/") for k in s3env.keys("ckpt", "retain/"))


@pytest.mark.tools  # MinIO (the minio fixture)
def test_a_short_object_fails_verify_and_a_tampered_one_fails_fetch(s3env, tmp_path):
    tier = _tier("tamper")
    committed = save_shared(tier, 8, os.urandom(2 * PIECE), nodes=2, piece=PIECE)
    client = s3env.client()
    key = f"tamper/step-00000008/{mf.slice_name('state.llmt', 1, 2)}"
    body = client.get_object(Bucket="ckpt", Key=key)["Body"].read()
    client.put_object(Bucket="ckpt", Key=key, Body=body[:-1])
    assert "has 1048575 bytes, the manifest says at least 1048576" in tier.verify(committed, None, ALLOWED)
    client.put_object(Bucket="ckpt", Key=key, Body=bytes([body[0] ^ 1]) + body[1:])
    assert tier.verify(committed, None, ALLOWED) is None, "sizes only: bytes are hashed as they are fetched"
    with pytest.raises(CheckpointError, match="does not match its manifest"):
        tier.fetch(committed, ["state.llmt"], tmp_path / "pulled", ALLOWED)


@pytest.mark.tools  # MinIO (the minio fixture)
def test_wrong_credentials_are_classified_and_the_secret_never_appears(minio, monkeypatch, caplog):
    secret = "not-the-right-secret-key-0123456789"
    for key, value in minio.env(secret=secret).items():
        monkeypatch.setenv(key, value)
    tier = _tier("creds")
    with caplog.at_level(logging.DEBUG), pytest.raises(Exception) as info:
        tier.list()
    degraded = classify(info.value)
    assert degraded.reason == "CredentialsRefused", degraded
    assert secret not in degraded.message
    assert "Secret" in degraded.message


@pytest.mark.tools  # MinIO (the minio fixture)
def test_a_bucket_that_lists_but_refuses_reads_raises_and_retention_deletes_nothing(s3env):
    """Listing allowed, GetObject refused (an IAM policy with s3:ListBucket only, or a
    sustained error on reads): the steps exist, so the tier must not list as empty; a
    job would start over and retention then delete the old steps as older."""
    from botocore.exceptions import ClientError
    from llmtrain_store.tier import StepUnreadable

    tier = _tier("noread", keep=1)
    for step in (1, 2):
        save_shared(tier, step, os.urandom(1000), nodes=1, piece=PIECE)
    before = s3env.keys("ckpt", "noread/")
    client = tier.client()

    def refused(**kw):  # the error S3 (and MinIO) answers a GetObject that the policy denies
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied."},
                           "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")

    client.get_object = refused
    with pytest.raises(StepUnreadable, match="s3 tier: steps 1, 2 are listed but cannot be read") as info:
        tier.list()
    assert classify(info.value).reason == "CredentialsRefused", "classified by its cause"
    assert tier.retain() == []
    assert s3env.keys("ckpt", "noread/") == before, "nothing deleted"


def test_an_unreachable_endpoint_is_classified(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    tier = S3Tier("s3", "s3://ckpt/x", endpoint="http://127.0.0.1:9")  # discard port: nothing listens
    tier.connect_timeout, tier.attempts = 1, 1
    with pytest.raises(Exception) as info:
        tier.list()
    assert classify(info.value).reason == "Unreachable"


def test_path_style_is_the_default_with_an_endpoint_and_can_be_turned_off():
    with_endpoint = S3Tier("s3", "s3://b/p", endpoint="http://127.0.0.1:1")
    assert with_endpoint.client().meta.config.s3["addressing_style"] == "path"
    virtual = S3Tier("s3", "s3://b/p", endpoint="http://127.0.0.1:1", path_style=False)
    assert virtual.client().meta.config.s3["addressing_style"] == "virtual"


@pytest.mark.tools  # MinIO (the minio fixture)
def test_content_addressed_pieces_are_stored_once_and_collected_when_unreferenced(s3env, tmp_path):
    from llmtrain_store import pieces

    from store.helpers import save_pieces

    tier = _tier("cas", keep=1, content_addressed=True)
    frozen = os.urandom(6 * PIECE)
    first = frozen + os.urandom(PIECE) + bytes(PIECE)
    _, sent1 = save_pieces(tier, 1, {"state.llmt": first}, nodes=2, piece=PIECE)
    second = frozen + os.urandom(PIECE) + bytes(PIECE)
    committed, sent2 = save_pieces(tier, 2, {"state.llmt": second}, nodes=2, piece=PIECE)
    assert 7 * PIECE < sent1 < 7.1 * PIECE, "the zero piece goes up compressed"
    assert sent2 == PIECE, "only the changed piece goes up"
    assert committed.manifest["format"] == mf.FORMAT_PIECES
    assert not [k for k in s3env.keys("ckpt", "cas/claims/")], "claims go once the step is committed"
    assert tier.retain() == [1]
    assert len(tier.piece_objects()) == 8, "step 1's own piece collected, the shared ones kept"
    assert tier.verify(tier.list()[0], None, ALLOWED) is None
    tier.fetch(tier.list()[0], ["state.llmt"], tmp_path / "pulled", ALLOWED)
    assert (tmp_path / "pulled" / "state.llmt").read_bytes() == second
    victim = next(o for o in tier.piece_objects() if not o.endswith(".zst"))
    tier.piece_delete(victim)
    assert tier.verify(tier.list()[0], None, ALLOWED) == f"{pieces.PIECES_DIR}/{victim} is missing"
    with pytest.raises(CheckpointError, match=f"{victim} cannot be read"):
        tier.fetch(tier.list()[0], ["state.llmt"], tmp_path / "again", ALLOWED)


@pytest.mark.tools  # MinIO (the minio fixture)
def test_a_dead_writers_claim_is_dropped_once_a_newer_step_commits_and_its_pieces_collected(s3env):
    from llmtrain_store.owner import Scope

    from store.helpers import save_pieces

    tier = _tier("stale", keep=1, content_addressed=True, scope=Scope.of("run-a"))
    other = _tier("stale", keep=1, content_addressed=True, scope=Scope.of("run-b"))
    tier.claim(3, 1, {"a" * 32 + "-5"})  # a writer of run-a that died after its claim
    other.claim(3, 1, {"b" * 32 + "-5"})  # another run's write, maybe in progress
    save_pieces(tier, 5, {"state.llmt": os.urandom(PIECE)}, piece=PIECE)
    tier.retain()
    claims = sorted(k.rsplit("/", 1)[-1] for k in s3env.keys("ckpt", "stale/claims/"))
    assert claims == [f"step-00000003.{Scope.of('run-b').token}.rank-00001.json"], "run-a's stale claim gone, run-b's kept"
