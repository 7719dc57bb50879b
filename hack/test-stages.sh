#!/usr/bin/env bash
# `make test` (what CI runs, .ci/run): every test, in three stages.
#
#   fast   lint (import contracts, ruff, mypy) and the unit and API-contract tests: no
#          torchrun, no cluster, no built tools. A failure here ends the run at once.
#   full   everything else, in two pytest sessions side by side: the cluster and
#          end-to-end suites on the local cluster, and the torchrun suites, the store
#          against MinIO and the tools.
#   kind   the smoke on real nodes, once the cluster half has passed and its process bed
#          is down, while the other half goes on: the images and the kind
#          bed built here (hack/kind/up.sh), the operator helm-installed, hangs a hung
#          process cannot report (a frozen rank, a rank holding the GIL, a whole pod frozen:
#          tests/e2e/test_hangs.py), a rank crash and a node loss recovered and the job
#          succeeding (tests/e2e/test_failures.py), a rank the kernel's OOM killer ends
#          under a real memory limit, named OOMKilled, and a rank out of GPU memory named
#          GPUOutOfMemory (tests/e2e/test_oom.py), a job in a
#          namespace enforcing Pod Security "restricted" run as its pods ask
#          (tests/e2e/test_restricted.py), a job's NetworkPolicy enforced by a real plugin
#          (tests/e2e/test_network_policy.py), a hostile pod in the job's namespace (a forged
#          rendezvous state and lease hello, 1,000 idle connections: test_hostile_pod.py),
#          then the bed taken down (hack/kind/e2e.sh). These modules run here only, not in
#          the full stage as well. LLMTRAIN_KIND_SMOKE=0 skips the stage, saying so, and
#          runs them in the full stage on the process bed instead.
#
# Go-built tools (the Kubernetes binaries, etcd, helm, MinIO: about 12 min of both cores
# on a cold cache) are only needed in the full stage. Their build starts first, at the
# lowest CPU priority, so that it uses what the downloads of the setup and the fast stage
# leave idle; the full stage's fixtures wait on the build's locks (tests/support/prebuild.py).
# After it, at the same priority, what the kind stage needs before a cluster exists (the
# Docker engine, the base, the node image, the project's images: hack/kind/prepare.sh,
# minutes on a cold machine) is made while the full stage's tests mostly wait; the kind
# stage then raises its priority back and waits for whatever is left of it.
# Each stage prints its wall time; docs/development.md keeps the measured runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
began=$(date +%s)
stamp() { echo "test-stages: $1 at +$(( $(date +%s) - began ))s"; }

mkdir -p .cache
kind_on=0
[ "${LLMTRAIN_KIND_SMOKE:-1}" = 0 ] || kind_on=1
# The background work's CPU share. Autogroup nice 19 (a session of its own, as
# tests/support/prebuild.py starts its build) covers the processes it starts, but not
# Docker's: a build's RUN steps and the engine's work belong to dockerd and its
# containers. Where the cgroup v1 cpu controller is writable (root here), the tools build
# and the kind preparation run in cgroups of their own, Docker's containers under /docker
# when the preparation runs, each given the lowest weight (2, against 1024 for a task of
# the stages); the kernel ignores autogroup for a task outside the root cgroup, so there
# only the weights count. The tools' weight goes back to 1024 when the full stage starts,
# whose cluster half needs them at once (on a cold machine the build is not done by then);
# the preparation's when the kind stage starts (and both at exit).
CPU_CG=/sys/fs/cgroup/cpu
tools_cg="" prep_cg="" docker_shares=""
prepare=0  # the background also prepares the kind stage: as root, with the stage on
[ "$kind_on" = 0 ] || [ "$(id -u)" != 0 ] || prepare=1
engine_was_up=0  # an engine this run did not start is never stopped by it
/usr/bin/docker version >/dev/null 2>&1 && engine_was_up=1
cpu_weight() {  # cpu_weight tools|prepare SHARES|restore
  [ -n "$tools_cg" ] || return 0
  if [ "$1" = tools ]; then
    echo "${2/restore/1024}" 2>/dev/null > "$tools_cg/cpu.shares" || true
  else
    echo "${2/restore/1024}" 2>/dev/null > "$prep_cg/cpu.shares" || true
    [ "$prepare" = 0 ] || echo "${2/restore/${docker_shares:-1024}}" 2>/dev/null > "$CPU_CG/docker/cpu.shares" || true
  fi
}
build_pid=""
if [ "${LLMTRAIN_PREBUILD_TOOLS:-1}" != 0 ] && command -v go >/dev/null 2>&1; then
  if [ -w "$CPU_CG/cgroup.procs" ] && mkdir -p "$CPU_CG/llmtrain-tools" "$CPU_CG/llmtrain-prepare" 2>/dev/null \
     && { [ "$prepare" = 0 ] || mkdir -p "$CPU_CG/docker" 2>/dev/null; }; then
    tools_cg=$CPU_CG/llmtrain-tools prep_cg=$CPU_CG/llmtrain-prepare
    [ "$prepare" = 0 ] || docker_shares=$(cat "$CPU_CG/docker/cpu.shares" 2>/dev/null || echo 1024)
  fi
  cpu_weight tools 2
  cpu_weight prepare 2
  # The default tools, then the kind bed's (kubelet, kubeadm, kube-proxy, kind, CoreDNS,
  # crictl, kube-router), which only the last stage needs; then, for the kind stage, its
  # engine and images.
  setsid sh -c '[ -z "$1" ] || echo $$ > "$1/cgroup.procs"
    echo 19 > /proc/self/autogroup 2>/dev/null
    nice -n 19 bash hack/cluster-tools/build.sh \
      minio etcd helm kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy kind coredns crictl kube-router \
      || exit
    [ "$3" = 1 ] || exit 0
    [ -z "$2" ] || echo $$ > "$2/cgroup.procs"
    echo "tools built; the kind stage'"'"'s engine and images next (log: .cache/kind-prepare.log)"
    exec nice -n 19 bash hack/kind/prepare.sh > .cache/kind-prepare.log 2>&1' sh "$tools_cg" "$prep_cg" "$prepare" \
    < /dev/null > .cache/cluster-tools-prebuild.log 2>&1 &
  build_pid=$!
  stamp "tools build started in the background (log: .cache/cluster-tools-prebuild.log)"
fi
kind_ran=0
stop_build() {
  if [ -n "$build_pid" ] && kill -0 "$build_pid" 2>/dev/null; then
    kill -TERM -- "-$build_pid" 2>/dev/null || true
  fi
  if [ -n "${runs_pid:-}" ]; then  # its teardown runs (MinIO, torchrun); what it printed is shown
    kill -INT "$runs_pid" 2>/dev/null || true
    wait "$runs_pid" 2>/dev/null || true
    echo "test-stages: the torchrun, store and tools suites, stopped:"
    cat .cache/full-runs.log 2>/dev/null || true
  fi
  cpu_weight tools restore
  cpu_weight prepare restore
  # An engine the background started for a kind stage that never ran (a red stage before
  # it): stopped, as the kind stage's own teardown would have (hack/kind/down.sh).
  # Its saved images too (the nodes' imports, hack/kind/saved-image.sh: 6 GB).
  if [ "$prepare" = 1 ] && [ "$kind_ran" = 0 ]; then
    /usr/bin/docker version >/dev/null 2>&1 && { bash hack/kind/saved-image.sh rm || true; }
    if [ "$engine_was_up" = 0 ] && [ "${LLMTRAIN_KEEP_ENGINE:-0}" != 1 ]; then
      bash hack/images/engine.sh stop >/dev/null 2>&1 || true
    fi
  fi
  [ -z "$tools_cg" ] || rmdir "$tools_cg" "$prep_cg" 2>/dev/null || true  # fails while a kept engine is in one
}
trap stop_build EXIT

bash hack/setup.sh
stamp "setup done"
# Debian's Prometheus and iproute2 for the full stage, fetched while the fast stage runs.
bash hack/system-deps.sh > .cache/system-deps.log 2>&1 &
deps_pid=$!

stamp "stage fast: lint"
make --no-print-directory lint
stamp "stage fast: unit and API-contract tests"
LLMTRAIN_PREBUILD_TOOLS=0 "$BIN/pytest" -m "not slow and not cluster and not e2e and not tools and not images and not kind" -p no:cacheprovider
stamp "stage fast passed"

if ! wait "$deps_pid"; then
  cat .cache/system-deps.log >&2
  exit 1
fi
stamp "stage full: torchrun, store, cluster and end-to-end suites"
# Its own temporary tree, removed once it passes: the trainer runs leave checkpoints in
# their tmp_path (8.3 GB in all at 3c79f11), and the kind stage needs that room to import
# the trainer image into a node (a cold run here stopped on the kind stage's room check
# with 12 GB free). The cluster half's goes before the kind stage, the other half's passed
# tests' as each ends; a failed stage keeps the rest for the post-mortem.
full_tmp=$(mktemp -d /tmp/llmtrain-full.XXXXXX)
# The kind stage's end-to-end modules run there, on real nodes, and not here as well
# (once each: the budget of a cold run); with the kind stage off they run here.
KIND_SMOKE=(tests/e2e/test_hangs.py tests/e2e/test_failures.py tests/e2e/test_oom.py tests/e2e/test_hostile_pod.py
            tests/e2e/test_restricted.py tests/e2e/test_network_policy.py)
on_kind=()
if [ "${LLMTRAIN_KIND_SMOKE:-1}" != 0 ]; then
  for module in "${KIND_SMOKE[@]}"; do on_kind+=("--ignore=$module"); done
fi
# Two pytest sessions side by side (docs/development.md, "How long `make test` takes"):
# the cluster and end-to-end suites on the local cluster, and everything else marked for
# this stage (the torchrun runs, the store against MinIO, the tools). One after the other
# they took 64 min here at 19f79f5, side by side 47 min at 8fc625c (the cluster half ended
# after 37). The kind stage starts as soon as the cluster half has passed (its process
# bed is then down), while the other half goes on; that half's output is shown once both
# end. The build started above already runs: neither session may start a second one.
FULL=(-p no:cacheprovider "${on_kind[@]}" "$@")
cpu_weight tools 1024  # the cluster half waits for them
# (A background job of a script starts with SIGINT ignored, and Python then installs no
# Ctrl-C handler: restored, so that Ctrl-C and the exit trap end it through its teardown.)
# A passed test's tmp_path goes when it ends: the kind stage imports the trainer image
# into its nodes while this half still runs.
(trap - INT; LLMTRAIN_PREBUILD_TOOLS=0 exec "$BIN/pytest" -m "(slow or tools) and not cluster and not e2e" \
  -o tmp_path_retention_policy=failed --basetemp="$full_tmp/runs" "${FULL[@]}") > .cache/full-runs.log 2>&1 &
runs_pid=$!
# Its output is shown as it runs and kept: CI keeps only the end of what a run printed,
# so a red stage names the failed tests of both halves once more as its last lines.
set +e
LLMTRAIN_PREBUILD_TOOLS=0 "$BIN/pytest" -m "cluster or e2e" --basetemp="$full_tmp/cluster" "${FULL[@]}" 2>&1 \
  | tee -i .cache/full-cluster.log  # -i: a Ctrl-C ends pytest through its teardown, which still prints
cluster_rc=${PIPESTATUS[0]}
set -e
[ "$cluster_rc" != 5 ] || cluster_rc=0  # pytest's 5 is "no test selected": arguments (-k ...) that pick tests of one half only
stamp "stage full: the cluster and end-to-end suites ended (exit $cluster_rc)"
runs_done() {  # the other half's end and its output; its exit code in runs_rc
  runs_rc=0
  wait "$runs_pid" || runs_rc=$?
  runs_pid=""
  cat .cache/full-runs.log
  [ "$runs_rc" != 5 ] || runs_rc=0
  stamp "stage full: the torchrun, store and tools suites ended (exit $runs_rc)"
}
failed_tests() {  # failed_tests HALF LOG: pytest's summary lines of its failed and erroring tests (not a captured
  # log's ERROR lines, whose level name is padded: a summary line names a test)
  grep -E '^(FAILED|ERROR) tests/' "$2" 2>/dev/null | cut -c1-400 | sed "s/^/test-stages: $1: /" || true
}
full_failed() {
  failed_tests "cluster and end-to-end" .cache/full-cluster.log
  failed_tests "torchrun, store and tools" .cache/full-runs.log
  stamp "stage full FAILED (cluster and end-to-end: exit $cluster_rc; torchrun, store and tools: exit $runs_rc; their files kept in $full_tmp)"
  exit 1
}
if [ "$cluster_rc" != 0 ]; then
  runs_done
  full_failed
fi
rm -rf "$full_tmp/cluster"

if [ "${LLMTRAIN_KIND_SMOKE:-1}" = 0 ]; then
  runs_done
  [ "$runs_rc" = 0 ] || full_failed
  rm -rf "$full_tmp"
  stamp "stage full passed (its temporary files removed)"
  stamp "stage kind SKIPPED (LLMTRAIN_KIND_SMOKE=0)"
  exit 0
fi
stamp "stage kind: the smoke on real nodes, beside the full stage's other half"
# The engine and images made in the background (hack/kind/prepare.sh) now run at full
# weight; what is left of them is waited for (a failure there is only logged: up.sh makes
# what is missing and names its own errors).
cpu_weight prepare 1024  # (the tools' is 1024 since the full stage)
if [ -n "$build_pid" ]; then
  echo 0 2>/dev/null > "/proc/$build_pid/autogroup" || true
  renice -n 0 -g "$build_pid" >/dev/null 2>&1 || true
  wait "$build_pid" || echo "test-stages: the background build or the kind stage's preparation failed (.cache/cluster-tools-prebuild.log, .cache/kind-prepare.log)" >&2
  build_pid=""
  stamp "the kind stage's engine and images prepared"
fi
# An engine the background started runs at nice 19, and the kind nodes would inherit it
# (their kubelets then lose every contest with their own pods): back to 0 before they exist.
# Every thread of dockerd and of its containerd: nice is a thread's, and a Go daemon starts
# a container's shim from any of its threads (renicing the main one alone left the nodes'
# etcd, API server and kubelet at 19, seen with top).
engine=$(cat .cache/docker/dockerd.pid 2>/dev/null || true)
if [ -n "$engine" ] && kill -0 "$engine" 2>/dev/null; then
  echo 0 2>/dev/null > "/proc/$engine/autogroup" || true
  for daemon in "$engine" $(pgrep -P "$engine"); do
    # shellcheck disable=SC2046
    renice -n 0 -p $(ls "/proc/$daemon/task" 2>/dev/null) >/dev/null 2>&1 || true
  done
fi
kind_ran=1
set +e
bash hack/kind/e2e.sh "${KIND_SMOKE[@]}" 2>&1 | tee -i .cache/kind-smoke.log
kind_rc=${PIPESTATUS[0]}
set -e
stamp "stage kind ended (exit $kind_rc)"
runs_done
kind_failed() {
  failed_tests "kind" .cache/kind-smoke.log
  stamp "stage kind FAILED (exit $kind_rc)"
}
if [ "$runs_rc" != 0 ]; then
  [ "$kind_rc" = 0 ] || kind_failed
  full_failed
fi
rm -rf "$full_tmp"
stamp "stage full passed (its temporary files removed)"
[ "$kind_rc" = 0 ] || { kind_failed; exit 1; }
stamp "stage kind passed"
