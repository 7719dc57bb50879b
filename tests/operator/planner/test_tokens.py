"""Each job's token (``planner/tokens.py``): drawn from the job's uid under the operator's
key, put in a Secret the planner creates with every pod it creates, and read by the
store's and the workers' containers from it; the operator's key read from its file
(``handlers/reconcile.py``), refused when it cannot make tokens."""

from __future__ import annotations

import re

import pytest
from llmtrain_operator.handlers.reconcile import _token_key, token_key_of
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.tokens import KEY_BYTES, TokenKeyError, job_token
from llmtrain_operator.settings import OperatorSettings
from support.planning import NOW, job, observed, running_status, summary, worker

KEY = bytes(range(32))
SECRET = job_token(KEY, "tiny-elastic", "uid-1").secret
TOKEN_ENV = {"name": "LLMTRAIN_RDZV_TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "token"}}}


def test_a_token_and_its_secrets_name_are_the_same_for_a_job_and_differ_between_jobs_and_keys():
    token = job_token(KEY, "tiny-elastic", "uid-1")
    assert token == job_token(KEY, "tiny-elastic", "uid-1") and len(token.value) == 64 and int(token.value, 16) >= 0
    assert re.fullmatch(r"tiny-elastic-rdzv-token-[0-9a-f]{10}", token.secret), "a name nobody without the key can know"
    assert token.secret[-10:] not in token.value, "the name tells nothing of the token"
    again = job_token(KEY, "tiny-elastic", "uid-2")  # a job re-created under its name has a new uid
    assert again.value != token.value and again.secret != token.secret
    other = job_token(bytes(reversed(KEY)), "tiny-elastic", "uid-1")
    assert other.value != token.value and other.secret != token.secret
    with pytest.raises(TokenKeyError, match="holds 31 bytes, 32 at least"):
        job_token(KEY[:31], "tiny-elastic", "uid-1")
    with pytest.raises(TokenKeyError, match="no uid"):
        job_token(KEY, "tiny-elastic", "")


def _creates(result, kind: str) -> list[dict]:
    return [a.manifest for a in result.actions if getattr(a, "manifest", {}).get("kind") == kind and type(a).__name__ == "CreateObject"]


def test_the_token_secret_comes_with_the_pods_once_a_pass_and_the_pods_read_it():
    raw = job()
    first = plan(raw, observed(raw, [], with_store=False), NOW, token_key=KEY)
    secrets = _creates(first, "Secret")
    assert len(secrets) == 1, "the store and two workers in one pass: one Secret create"
    secret = secrets[0]
    assert secret["metadata"]["name"] == SECRET and secret["stringData"] == {"token": job_token(KEY, "tiny-elastic", "uid-1").value}
    assert secret["immutable"] is True and secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    pods = _creates(first, "Pod")
    assert [p["metadata"]["name"] for p in pods] == ["tiny-elastic-rdzv", "tiny-elastic-worker-0", "tiny-elastic-worker-1"]
    for pod in pods:
        assert TOKEN_ENV in pod["spec"]["containers"][0]["env"], pod["metadata"]["name"]
    assert job_token(KEY, "tiny-elastic", "uid-1").value not in str(first.events) + str(first.status)


def test_a_pass_that_creates_no_pod_creates_no_secret_and_a_replacement_brings_it_again():
    raw = job(status=running_status(step=20))
    steady = plan(raw, observed(raw, [worker(0), worker(1)]), NOW, token_key=KEY)
    assert not _creates(steady, "Secret"), summary(steady.actions)
    replacing = plan(raw, observed(raw, [worker(0)]), NOW, token_key=KEY)
    assert [s["metadata"]["name"] for s in _creates(replacing, "Secret")] == [SECRET]
    assert TOKEN_ENV in _creates(replacing, "Pod")[0]["spec"]["containers"][0]["env"]


def test_without_a_key_or_a_uid_no_secret_is_made_and_no_pod_waits_for_one():
    for raw, key in ((job(), None), (job({"metadata.uid": ""}), KEY)):
        result = plan(raw, observed(raw, [], with_store=False), NOW, token_key=key)
        assert not _creates(result, "Secret")
        assert all(TOKEN_ENV not in p["spec"]["containers"][0].get("env", []) for p in _creates(result, "Pod"))


def test_the_operators_key_is_read_from_its_file_and_refused_when_it_cannot_make_tokens(tmp_path):
    _token_key.cache_clear()
    good = tmp_path / "key"
    good.write_bytes(b"k" * KEY_BYTES + b"\n")
    assert token_key_of(OperatorSettings(token_key_file=str(good))) == b"k" * KEY_BYTES, "the newline left out"
    short = tmp_path / "short"
    short.write_bytes(b"k" * 10)
    with pytest.raises(TokenKeyError, match=f"{short} holds 10 bytes, 32 at least"):
        token_key_of(OperatorSettings(token_key_file=str(short)))
    with pytest.raises(TokenKeyError, match="cannot read the token key .*missing"):
        token_key_of(OperatorSettings(token_key_file=str(tmp_path / "missing")))
    own = token_key_of(OperatorSettings())
    assert len(own) == KEY_BYTES and token_key_of(OperatorSettings()) == own, "no file: one random key for the process"
