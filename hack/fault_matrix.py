"""Runs the fault-matrix scenarios (docs/development.md, "The fault matrix") for several
rounds in a row and prints, per scenario, how many rounds passed and how long its tests
took.

Each round is its own pytest session, so each starts the local cluster, installs the
operator with helm and starts Prometheus afresh, as a CI run does. Every round runs, even
after a failure: the table shows where a streak broke, and each round's pytest output is
kept beside its JUnit report for the failure's pod logs.

    .venv/bin/python hack/fault_matrix.py --rounds 5 --out .cache/fault-matrix
    .venv/bin/python hack/fault_matrix.py --rounds 5 --scenarios 16-22   # a subset

Needs root and no other local cluster on the machine (they share ports and the bridge).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

E2E, BED = "tests/e2e", "tests/cluster/test_bed.py"


def _module(name: str, *tests: str) -> tuple[str, ...]:
    return tuple(f"{E2E}/{name}::{test}" for test in tests)


# In these modules one job (two in test_hangs.py) goes through several faults, each
# fault's checks a test of its own, and the last tests check how the job ended, which
# needs every fault before it: a scenario there names every test of its module.
FAILURES = _module(
    "test_failures.py",
    "test_a_process_crash_is_charged_to_its_pod_and_recovered",
    "test_a_lost_node_is_charged_once_the_survivor_trains_on_and_the_replacement_avoids_it",
    "test_the_job_succeeds_with_each_failure_charged_once",
)
# Scenarios 5 and 6 share them: a frozen rank and a rank holding the GIL, each its own job.
HANGS = _module(
    "test_hangs.py",
    "test_a_frozen_only_rank_is_ended_by_its_launcher_and_restored_from_tier_1",
    "test_a_rank_holding_the_gil_is_blamed_its_blocked_peer_is_not_and_the_pair_resumes",
    "test_a_frozen_pod_is_replaced_on_its_peers_reports_and_charged_as_a_hang_on_it",
    "test_a_straggler_is_reported_with_its_rank_pod_and_node_and_not_charged",
    "test_the_single_job_rolls_back_its_nan_and_succeeds_charged_only_its_hang",
    "test_the_pair_succeeds_charged_its_hang_and_its_frozen_pod_once_each",
    "test_prometheus_has_the_two_jobs_charges_as_the_operator_counted_them",
)
LIFECYCLE = _module(
    "test_lifecycle.py",
    "test_an_operator_failover_leaves_the_running_pods_alone",
    "test_prometheus_scrapes_the_trainers_and_the_operator_and_no_alert_fires",
    "test_an_eviction_is_a_disruption_not_a_restart_and_loses_at_most_the_step_in_flight",
    "test_a_suspended_job_keeps_its_status_and_checkpoints_and_resumes_from_the_newest",
    "test_deleting_the_job_garbage_collects_its_children",
)
LEADER_ELECTION = _module(
    "test_leader_election.py",
    "test_two_replicas_started_together_never_both_write",
    "test_a_lost_leader_is_replaced_by_the_standby_which_alone_writes_and_says_it_leads",
    "test_a_gracefully_stopped_leader_hands_over_at_the_next_retry",
)


@dataclasses.dataclass(frozen=True)
class Scenario:
    number: int
    title: str
    tests: tuple[str, ...]  # pytest node ids; a bare function name covers its parameters


SCENARIOS = (
    Scenario(1, "SIGKILL of one rank", (
        f"{E2E}/test_fault_matrix.py::test_01_one_rank_sigkilled_restarts_in_place_from_its_node_local_checkpoint",
    )),
    Scenario(2, "a whole node lost, then back", FAILURES),
    Scenario(3, "the pod hosting rank 0 deleted", (
        f"{E2E}/test_fault_matrix.py::test_03_the_pod_hosting_rank_0_deleted_saves_its_step_and_is_replaced",
    )),
    Scenario(4, "the rendezvous store pod killed", (
        f"{E2E}/test_fault_matrix.py::test_04_a_killed_rendezvous_store_restarts_and_the_workers_resume_from_their_sigterm_checkpoint",
    )),
    Scenario(5, "a frozen rank", HANGS),
    Scenario(6, "a real collective hang", HANGS),
    Scenario(7, "tiers 1 and 2 wiped, S3 restores", (
        f"{E2E}/test_checkpoints.py::test_every_copy_but_s3_wiped_the_job_resumes_from_s3_through_tier_1",
    )),
    Scenario(8, "the newest checkpoint corrupted", (
        f"{E2E}/test_fault_matrix.py::test_08_a_corrupted_newest_checkpoint_is_skipped_with_the_reason_and_the_previous_one_used",
    )),
    Scenario(9, "eviction with SIGTERM", LIFECYCLE),
    Scenario(10, "the operator restarted during a node-loss recovery", (
        f"{E2E}/test_fault_matrix.py::test_10_an_operator_restarted_during_a_node_loss_recovers_it_exactly_once",
    )),
    Scenario(11, "the API server restarted", (f"{E2E}/test_fault_matrix.py::test_11_an_api_server_restart_costs_the_job_nothing",)),
    Scenario(12, "the restart budget exhausted", (
        f"{E2E}/test_fault_matrix.py::test_12_an_exhausted_restart_budget_fails_the_job_once_and_starts_nothing_after",
    )),
    Scenario(13, "an invalid spec", (
        f"{BED}::test_invalid_specs_are_rejected_by_the_api_servers_schema_and_cel",
        f"{BED}::test_operator_only_rules_are_accepted_by_the_server_and_left_to_the_operator",
        f"{BED}::test_immutable_fields_are_enforced_on_update",
        f"{E2E}/test_checkpoints.py::test_a_missing_credentials_secret_makes_the_job_invalid_naming_it_and_creating_it_lets_the_job_run",
    )),
    Scenario(14, "many jobs, room for few", (
        f"{E2E}/test_fault_matrix.py::test_14_jobs_beyond_the_clusters_room_wait_without_restarts_or_pod_churn",
    )),
    Scenario(15, "the standby replica takes over", LEADER_ELECTION),
    Scenario(16, "a whole pod frozen", HANGS),
    Scenario(17, "a node that keeps killing the job's pods", (
        f"{E2E}/test_flapping_node.py::test_a_node_killing_the_jobs_pods_again_and_again_is_charged_once_and_quarantined",
    )),
    Scenario(18, "a rank killed by the OOM killer", (
        f"{E2E}/test_oom.py::test_a_rank_the_oom_killer_ends_is_charged_as_oom_killed_with_the_peak_and_the_limit",
    )),
    Scenario(19, "pods that cannot be scheduled", (
        f"{E2E}/test_scheduling.py::test_pods_asking_for_more_gpus_than_any_node_has_show_the_schedulers_words_on_the_job",
    )),
    Scenario(20, "the job deleted while a node is down", (
        f"{E2E}/test_deletion.py::test_a_job_deleted_while_a_node_is_down_leaves_no_pod_behind",
    )),
    Scenario(21, "a node a health agent reports sick", (
        f"{E2E}/test_node_health.py::test_a_sick_node_is_drained_before_a_rank_fails_and_the_job_resumes_from_the_emergency_checkpoint",
    )),
    Scenario(22, "a node with a degraded link", (
        f"{E2E}/test_preflight.py::test_a_node_with_a_degraded_link_fails_the_pre_flight_check_and_is_quarantined_uncharged",
    )),
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One test case of one round, as its JUnit report has it."""

    nodeid: str  # without parameters: "tests/e2e/test_x.py::test_y"
    seconds: float
    outcome: str  # "passed", "failed", "error" or "skipped"


def selection(scenarios: tuple[Scenario, ...] = SCENARIOS) -> list[str]:
    """Every node id the scenarios name, once each, grouped by module in the order the
    modules first appear: a module's fixtures (Prometheus, the e2e MinIO server) are then
    set up once per round rather than once per visit."""
    tests = list(dict.fromkeys(test for s in scenarios for test in s.tests))
    modules = list(dict.fromkeys(t.split("::", 1)[0] for t in tests))
    return sorted(tests, key=lambda t: modules.index(t.split("::", 1)[0]))


def read_junit(path: Path) -> list[Case]:
    """The cases of one pytest JUnit report. A missing or unreadable report (pytest died
    before writing it) yields nothing, which the table shows as a failed round."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    cases = []
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "").split("[", 1)[0]
        outcome = "passed"
        for child, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if case.find(child) is not None:
                outcome = label
                break
        cases.append(Case(f"{module}::{name}", float(case.get("time", 0) or 0), outcome))
    return cases


def verdict(scenario: Scenario, cases: list[Case]) -> tuple[bool, float]:
    """Whether one round passed the scenario (every case of every test it names ran and
    passed; a test that never ran is a failure), and the seconds its tests took."""
    ok, seconds = True, 0.0
    for test in scenario.tests:
        mine = [c for c in cases if c.nodeid == test]
        ok = ok and bool(mine) and all(c.outcome == "passed" for c in mine)
        seconds += sum(c.seconds for c in mine)
    return ok, seconds


def longest_streak(results: list[bool]) -> int:
    best = run = 0
    for passed in results:
        run = run + 1 if passed else 0
        best = max(best, run)
    return best


def chosen(spec: str | None) -> tuple[Scenario, ...]:
    """The scenarios ``--scenarios`` names (``3,16-22``); every one when None."""
    if spec is None:
        return SCENARIOS
    numbers: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"--scenarios: {part!r} is not a number or a range such as 16-22")
        numbers.update(range(int(first), int(last or first) + 1))
    unknown = sorted(numbers - {s.number for s in SCENARIOS})
    if unknown:
        raise ValueError(f"--scenarios: no scenario {', '.join(map(str, unknown))} (1..{len(SCENARIOS)})")
    return tuple(s for s in SCENARIOS if s.number in numbers)


def table(rounds: list[list[Case]], scenarios: tuple[Scenario, ...] = SCENARIOS) -> str:
    lines = [
        "| # | scenario | rounds passed | in a row | median s | worst s |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        verdicts = [verdict(scenario, cases) for cases in rounds]
        passed = [ok for ok, _ in verdicts]
        seconds = [s for _, s in verdicts]
        marks = "".join("P" if ok else "F" for ok in passed)
        lines.append(
            f"| {scenario.number} | {scenario.title} | {sum(passed)}/{len(passed)} ({marks}) | "
            f"{longest_streak(passed)} | {statistics.median(seconds):.0f} | {max(seconds):.0f} |"
        )
    return "\n".join(lines)


def run_round(index: int, out: Path, pytest_args: list[str], scenarios: tuple[Scenario, ...] = SCENARIOS
              ) -> tuple[list[Case], float, int]:
    junit, log = out / f"round-{index}.xml", out / f"round-{index}.log"
    # Durations of the call alone: the first test's setup also starts the cluster.
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "junit_duration_report=call",
           f"--junitxml={junit}", *pytest_args, *selection(scenarios)]
    started = time.monotonic()
    with log.open("w") as sink:
        code = subprocess.run(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, check=False).returncode
    return read_junit(junit), time.monotonic() - started, code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "fault-matrix")
    parser.add_argument("--scenarios", default=None, help="numbers and ranges, e.g. 3,16-22 (default: every scenario)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        scenarios = chosen(args.scenarios)
    except ValueError as err:
        parser.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = []
    for index in range(1, args.rounds + 1):
        cases, seconds, code = run_round(index, args.out, args.pytest_args, scenarios)
        rounds.append(cases)
        failed = sorted({c.nodeid for c in cases if c.outcome != "passed"})
        print(f"round {index}/{args.rounds}: pytest exit {code}, {seconds / 60:.1f} min, "
              f"{len(cases)} cases, failed: {', '.join(failed) or 'none'}", flush=True)
    print(table(rounds, scenarios))
    every = all(longest_streak([verdict(s, c)[0] for c in rounds]) == args.rounds for s in scenarios)
    print(f"RESULT rounds={args.rounds} all_scenarios_passed_every_round={str(every).lower()}")
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())
