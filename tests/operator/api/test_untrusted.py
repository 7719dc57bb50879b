"""Values from pods are untrusted input: each bad one is left out and named, and no pass
raises on it (issue: "one bad value from a pod wedges a job forever")."""

from __future__ import annotations

import json
import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmtrain_operator.api import untrusted
from llmtrain_operator.api.observed import pod_view
from llmtrain_operator.planner import plan
from llmtrain_operator.api.observed import ContainerMemory
from llmtrain_operator.probe import combine, memory_of, parse, parse_launcher, peer_waits_of
from support.planning import NOW, job, observed, running_status, worker

CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
"""What the API server accepts as a condition's reason (metav1.Condition)."""


def test_numbers_are_whole_finite_and_bounded():
    assert [untrusted.count(v) for v in (0, 7, 7.0, "12", 2**53)] == [0, 7, 7, 12, 2**53]
    for bad in (-1, 2**53 + 1, 7.5, math.nan, math.inf, -math.inf, True, "x", "", "1e3", "²", "-3", None, [1], {"a": 1}):
        assert untrusted.count(bad) is None, bad
    assert untrusted.exit_code(137) == 137 and untrusted.exit_code(256) is None and untrusted.exit_code("1") is None
    assert untrusted.seconds(1.5) == 1.5 and untrusted.seconds(math.inf) is None and untrusted.seconds(-1) is None


def test_reasons_are_tokens_the_api_server_takes():
    assert untrusted.tier_reason("NoSpace") == "NoSpace"
    for bad in ("No Space", "nospace", "Made Up", "NoSpace\n", "", None, 3):
        assert untrusted.tier_reason(bad) is None, bad
    assert untrusted.token("OOMKilled") == "OOMKilled" and untrusted.token("out of memory") is None


def test_a_termination_message_keeps_its_good_fields_and_names_its_bad_ones():
    kept, bad = untrusted.termination(json.dumps({"code": "x", "reason": "Crash", "rank": 1, "step": 1e999,
                                                  "message": "m" * 5000, "checkpoints": {"local": 5, "evil": 1},
                                                  "somethingNew": [1]}))
    assert kept == {"reason": "Crash", "rank": 1, "message": "m" * untrusted.MAX_MESSAGE}
    assert [b.split(" (")[0] for b in bad] == ["termination message field 'code'", "termination message field 'step'",
                                               "termination message field 'checkpoints'"]
    # null is the launcher's "unknown" (a step before the first): left out, no complaint
    assert untrusted.termination('{"code": 82, "step": null, "rank": null}') == ({"code": 82}, [])
    # a value nested just short of the parser's limit, read deep in a pass's stack: refused,
    # and the report of it does not raise (quoting it recursed past the limit)
    def deep(frames, call):
        return call() if frames == 0 else deep(frames - 1, call)

    for depth in range(700, 1000):
        kept, bad = deep(150, lambda: untrusted.termination('{"code": ' + "[" * depth + "]" * depth + "}"))  # noqa: B023
        assert kept == {} and len(bad) <= 1
    # not the launcher's (plain text, a list, JSON nested past the parser's depth): nothing, no complaint
    for message in ("Error: killed", "[1, 2]", "[" * 100_000 + "]" * 100_000, "", None):
        assert untrusted.termination(message) == ({}, []), message[:20] if message else message


def test_the_last_step_is_a_step_and_a_finite_loss_or_nothing():
    good = {"step": 60, "loss": 2.5}
    assert untrusted.termination(json.dumps({"code": 0, "lastStep": good})) == ({"code": 0, "lastStep": good}, [])
    assert untrusted.termination('{"lastStep": {"step": 3, "loss": -1}}')[0] == {"lastStep": {"step": 3, "loss": -1.0}}
    for bad in ({"step": -1, "loss": 2.5}, {"step": "60", "loss": 2.5}, {"step": 60, "loss": "2.5"}, {"step": 60},
                {"step": 60, "loss": True}, {"step": 1.5, "loss": 2.5}, {"step": 60, "loss": 1e300}, [60, 2.5], 60,
                {"step": 60, "loss": 2.5, "extra": 1}):
        kept, reported = untrusted.termination(json.dumps({"code": 0, "lastStep": bad}))
        assert kept == {"code": 0} and [r.split(" (")[0] for r in reported] == ["termination message field 'lastStep'"], bad
    # Python's JSON reader takes NaN and Infinity, which no JSON writer should send
    for literal in ("NaN", "Infinity", "-Infinity"):
        kept, reported = untrusted.termination('{"lastStep": {"step": 60, "loss": ' + literal + "}}")
        assert kept == {} and len(reported) == 1, literal


def test_an_oom_report_is_a_kill_count_and_byte_counts_or_nothing():
    good = {"kills": 1, "peakBytes": 3 << 30, "limitBytes": None}
    assert untrusted.termination(json.dumps({"code": 137, "oom": good})) == ({"code": 137, "oom": good}, [])
    for bad in ({"kills": 0, "peakBytes": 1, "limitBytes": 2}, {"kills": 1, "peakBytes": -1, "limitBytes": 2},
                {"kills": 1, "peakBytes": "1", "limitBytes": 2}, {"kills": True, "peakBytes": 1, "limitBytes": 2},
                {"kills": 1, "peakBytes": 1}, {"kills": 1, "peakBytes": 1, "limitBytes": 2, "more": 3}, [1], "yes",
                {"kills": 1, "peakBytes": 1e300, "limitBytes": 2}):
        kept, reported = untrusted.termination(json.dumps({"code": 137, "oom": bad}))
        assert kept == {"code": 137} and [r.split(" (")[0] for r in reported] == ["termination message field 'oom'"], bad


def test_a_pods_final_counts_and_memory_are_known_causes_and_counts_or_nothing():
    counts, memory = {"crash": 2, "victim": 0}, {"oomKills": 0, "peakBytes": 5, "limitBytes": None}
    assert untrusted.termination(json.dumps({"failedAttempts": counts, "memory": memory})) == (
        {"failedAttempts": counts, "memory": memory}, [])
    for key, bad in (("failedAttempts", {"crash": -1}), ("failedAttempts", {"oops": 1}), ("failedAttempts", {"crash": "1"}),
                     ("failedAttempts", [1]), ("memory", {"oomKills": None, "peakBytes": 1, "limitBytes": 2}),
                     ("memory", {"oomKills": 1, "peakBytes": 1}), ("memory", {"oomKills": 1, "peakBytes": 1.5, "limitBytes": 2})):
        kept, reported = untrusted.termination(json.dumps({"code": 0, key: bad}))
        assert kept == {"code": 0} and [r.split(" (")[0] for r in reported] == [f"termination message field {key!r}"], bad


def test_a_launchers_memory_figures_are_whole_byte_counts_or_left_out():
    page = ("llmtrain_launcher_oom_kills_total 2\nllmtrain_launcher_memory_peak_bytes 3.221225472e+09\n"
            "llmtrain_launcher_memory_limit_bytes 4294967296\n")
    assert parse_launcher(page).memory == ContainerMemory(2, 3 << 30, 4 << 30)
    assert parse_launcher("llmtrain_launcher_workers_running 1\n").memory is None, "no cgroup read: no figures"
    hostile = parse_launcher("llmtrain_launcher_oom_kills_total -3\nllmtrain_launcher_memory_peak_bytes NaN\n"
                             "llmtrain_launcher_memory_limit_bytes 1.5\n")
    assert hostile.memory is None and len(hostile.rejected) == 3, hostile.rejected
    no_limit = parse_launcher("llmtrain_launcher_oom_kills_total 0\nllmtrain_launcher_memory_peak_bytes +Inf\n")
    assert no_limit.memory == ContainerMemory(0, None, None) and len(no_limit.rejected) == 1


def test_a_launchers_wait_on_a_peer_is_finite_seconds_or_left_out():
    assert parse_launcher("llmtrain_launcher_peer_wait_seconds 31.5\n").peer_wait == 31.5
    assert parse_launcher("llmtrain_launcher_workers_running 1\n").peer_wait is None, "not waiting: no figure"
    for bad in ("NaN", "-1", "+Inf", "1e999"):
        hostile = parse_launcher(f"llmtrain_launcher_peer_wait_seconds {bad}\n")
        assert hostile.peer_wait is None and len(hostile.rejected) == 1, (bad, hostile.rejected)
        assert peer_waits_of({"p": hostile}) == {}


def _pod(labels=None, message=None, exit_code=1, reason="Error"):
    terminated = {"exitCode": exit_code, "reason": reason, "finishedAt": "2026-11-21T11:59:00Z"}
    if message is not None:
        terminated["message"] = message
    return {"metadata": {"name": "tiny-elastic-worker-1", "uid": "u1", "creationTimestamp": "2026-11-21T11:50:00Z",
                         "labels": {"llmtrain.io/role": "worker", "llmtrain.io/slot": "1", **(labels or {})}},
            "spec": {"nodeName": "node-1"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}}


def test_a_pod_view_ignores_and_names_a_bad_label_message_exit_code_and_reason():
    view = pod_view(_pod(labels={"llmtrain.io/generation": "abc", "llmtrain.io/slot": "¹"},
                         message='{"code": 1e999}', exit_code="137", reason="out of memory"))
    assert (view.generation, view.slot, view.exit_code, view.reason, view.termination) == (0, None, None, None, {})
    assert [r.split(" (")[0] for r in view.rejected] == [
        "termination message field 'code'", "label llmtrain.io/generation", "exit code", "termination reason",
        "label llmtrain.io/slot"]


def test_a_metrics_page_with_infinities_nans_and_forged_labels_keeps_only_usable_values():
    page = "\n".join([
        "llmtrain_trainer_step +Inf",
        "llmtrain_trainer_world_size 2",
        'llmtrain_trainer_checkpoint_last_step{tier="local"} NaN',
        'llmtrain_trainer_checkpoint_last_step{tier="shared"} 40',
        'llmtrain_trainer_checkpoint_last_step{tier="../../etc"} 40',
        'llmtrain_trainer_checkpoint_tier_degraded{tier="s3",reason="No Space"} 1',
        'llmtrain_trainer_failed_attempts_total{cause="hang"} 1e300',
        'llmtrain_trainer_failed_attempts_total{cause="crash"} 2',
        'llmtrain_trainer_failed_attempts_total{cause="made-up"} 2',
        'llmtrain_trainer_straggler{rank="٣"} 3',
        'llmtrain_trainer_skipped_samples{first_step="1",last_step="x",first_sample="0",end_sample="8"} 1',
        "llmtrain_trainer_last_step_timestamp_seconds -5",
    ]) + "\n"
    probe = parse(page)
    assert (probe.step, probe.world_size, probe.last_step_time) == (None, 2, None)
    assert probe.last_checkpoint == {"shared": 40}
    assert probe.tier_degraded == {"s3": "Error"}, "a reason outside TIER_REASONS is read as Error"
    assert probe.failed_attempts == {"crash": 2} and probe.stragglers == {} and probe.skipped == ()
    assert [r.split(" (")[0] for r in probe.rejected] == [
        "metric llmtrain_trainer_step value", "metric llmtrain_trainer_checkpoint_last_step value",
        "metric llmtrain_trainer_checkpoint_last_step labels", "metric llmtrain_trainer_checkpoint_tier_degraded labels",
        "metric llmtrain_trainer_failed_attempts_total value", "metric llmtrain_trainer_failed_attempts_total labels",
        "metric llmtrain_trainer_straggler labels", "metric llmtrain_trainer_skipped_samples labels",
        "metric llmtrain_trainer_last_step_timestamp_seconds value"]
    launcher = parse_launcher('llmtrain_launcher_step -Inf\nllmtrain_launcher_failed_attempts_total{cause="crash"} 1\n')
    assert launcher.step is None and launcher.failed == {"crash": 1} and len(launcher.rejected) == 1
    _, _, rejected = combine({"p": probe}, {"p": launcher, "q": launcher})
    assert rejected == {"p": probe.rejected + launcher.rejected, "q": launcher.rejected}


def test_a_bad_value_is_reported_once_per_pod_and_field_and_the_failure_is_still_handled():
    raw = job(status=running_status())
    failed = pod_view(_pod(message='{"code": "x", "reason": "Crash"}', exit_code=137))
    obs = observed(raw, [worker(0), failed])
    result = plan(raw, obs, NOW)
    warned = [e for e in result.events if e.reason == "UnusablePodValue"]
    assert len(warned) == 1 and "tiny-elastic-worker-1" in warned[0].message and "'code'" in warned[0].message
    assert result.status["lastFailure"]["reason"] == "Signal9", "classified by the kubelet's exit code instead"
    again = plan({**raw, "status": result.status}, obs, NOW)
    assert not [e for e in again.events if e.reason == "UnusablePodValue"], "reported once"


def test_a_forged_attempt_count_charges_no_more_than_ends_the_budget():
    from llmtrain_operator.api.observed import TrainerProbe

    raw = job({"spec.faultTolerance.maxRestarts": 3}, status=running_status())
    obs = observed(raw, [worker(0), worker(1)], probes={"tiny-elastic-worker-1": TrainerProbe(step=20, failed_attempts={"crash": 2**53})})
    result = plan(raw, obs, NOW)
    assert result.status["phase"] == "Failed" and result.status["restarts"] <= 4


# ---------------------------------------------------------------- any value, no raise

TEXT = st.text(max_size=30)
NUMBERS = st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1e999, -1e999]))
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                       lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
                       max_leaves=8)
MESSAGES = st.one_of(TEXT, st.dictionaries(st.sampled_from(["code", "reason", "rank", "step", "message", "checkpoints",
                                                            "countedInPlace", "lastStep", "oom", "memory", "failedAttempts",
                                                            "other"]), JSONISH, max_size=5)
                     .map(lambda d: json.dumps(d)))
SAMPLE_VALUES = st.one_of(NUMBERS.map(repr), st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "0", "3", "2.5"]))
METRICS = st.sampled_from(["llmtrain_trainer_step", "llmtrain_trainer_world_size", "llmtrain_trainer_checkpoint_last_step",
                           "llmtrain_trainer_checkpoint_tier_degraded", "llmtrain_trainer_failed_attempts_total",
                           "llmtrain_trainer_straggler", "llmtrain_trainer_skipped_samples",
                           "llmtrain_trainer_last_step_timestamp_seconds", "llmtrain_trainer_checkpoint_interval_steps",
                           "llmtrain_trainer_checkpoint_cost_seconds", "llmtrain_trainer_numerics_rollbacks",
                           "llmtrain_trainer_heal_rounds", "llmtrain_trainer_worker_group_restarts_total",
                           "llmtrain_launcher_oom_kills_total",
                           "llmtrain_launcher_memory_peak_bytes", "llmtrain_launcher_memory_limit_bytes",
                           "llmtrain_launcher_failed_attempts_total", "llmtrain_launcher_peer_wait_seconds"])
LABEL_KEYS = st.sampled_from(["tier", "reason", "cause", "rank", "first_step", "last_step", "first_sample", "end_sample"])
LABEL_VALUES = st.one_of(st.sampled_from(["local", "shared", "s3", "NoSpace", "crash", "hang", "1", "0"]),
                         st.text(alphabet=st.characters(blacklist_characters='"\\\n'), max_size=12))


@st.composite
def pages(draw):
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        labels = draw(st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=3))
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{draw(METRICS)}{{{body}}} {draw(SAMPLE_VALUES)}" if body else f"{draw(METRICS)} {draw(SAMPLE_VALUES)}")
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generation=st.one_of(TEXT, st.sampled_from(["0", "1", "99999999999999999999"])), slot=st.one_of(TEXT, st.just("1")),
       message=MESSAGES, exit_code=st.one_of(st.none(), NUMBERS, TEXT, st.booleans()), reason=st.one_of(st.none(), TEXT),
       page=pages(), phase=st.sampled_from(["Failed", "Running", "Succeeded"]))
def test_no_value_from_a_pod_makes_a_pass_raise_or_write_what_the_api_server_refuses(generation, slot, message, exit_code,
                                                                                     reason, page, phase):
    raw = job(status=running_status())
    body = _pod(labels={"llmtrain.io/generation": generation, "llmtrain.io/slot": slot}, message=message,
                exit_code=exit_code, reason=reason)
    body["status"]["phase"] = phase
    probe, launcher = parse_or_none(page), parse_or_none(page, parse_launcher)
    view = pod_view(body)
    launchers = {view.name: launcher} if launcher else {}
    probes, attempts, rejected = combine({view.name: probe} if probe else {}, launchers)
    result = plan(raw, observed(raw, [worker(0), view], probes=probes, launcher_attempts=attempts,
                                launcher_memory=memory_of(launchers), peer_waits=peer_waits_of(launchers),
                                silent={"tiny-elastic-worker-0": 60.0}, rejected_values=rejected), NOW)
    json.dumps(result.status, allow_nan=False)  # what the API server takes: no NaN, no Infinity
    for condition in result.status.get("conditions", []):
        assert CONDITION_REASON.match(condition["reason"]), condition
    named = view.rejected + rejected.get(view.name, ())
    warned = [e.message for e in result.events if e.reason == "UnusablePodValue"]
    fields = {w.split(" (")[0] for w in named}
    assert len(warned) == len(fields), (named, warned)


def parse_or_none(page, parser=parse):
    try:
        return parser(page)
    except ValueError:  # not Prometheus' format at all: the probes treat it as no answer
        return None


def test_a_page_gives_at_most_its_newest_skipped_windows():
    from llmtrain_operator.probe import MAX_PAGE_WINDOWS

    lines = [f'llmtrain_trainer_skipped_samples{{first_step="{i}",last_step="{i}",first_sample="{8 * i}",end_sample="{8 * i + 8}"}} 1'
             for i in range(3 * MAX_PAGE_WINDOWS)]
    probe = parse("# TYPE llmtrain_trainer_skipped_samples gauge\n" + "\n".join(lines) + "\n")
    assert len(probe.skipped) == MAX_PAGE_WINDOWS
    assert min(w[0] for w in probe.skipped) == 2 * MAX_PAGE_WINDOWS  # the newest by sample
