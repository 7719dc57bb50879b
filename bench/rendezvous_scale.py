"""The rendezvous at size: N torchrun agents forming a round on one store, and re-forming
it after one agent dies and after 8 more die, on the project's store (leases, the state
guard, the job's token, the agent's patches) and on a plain TCPStore with torch's own
handler, side by side in one run.

Each agent is a thread running torch's own c10d rendezvous handler, with no training
(``_rdzv_agents.py``; at most ``--agents-per-process`` threads per process, each agent
its own loopback address as its node's address and its own store connection). The
store is a separate process: ``python -m llmtrain_trainer.rendezvous.store`` with the
job's token (``ours``), or a bare ``TCPStore`` server (``plain``). ``min_nodes`` is
N - rounds - 8 and ``max_nodes`` N, so a round forms at once when all N have joined, and
after losses only once the losses are known and the last call (1 s) has passed, or
(ours) once every lease holder has joined. Each N: the round formed, then ``--rounds``
single deaths, each followed by its re-formed round (median and worst reported), then 8
deaths at once. A death stops the agent's keep-alive and closes its lease
connection (what the kernel does when a pod's processes die); the survivors join the
next round at once, as torchrun's agents do when their workers fail.

Timed by this script's clock: from the command that starts the round (or the death) to
the last survivor's ``next_rendezvous`` returning (its line read here). The store's CPU
seconds and peak memory come from ``/proc``. A phase that takes longer than
``--timeout`` is reported as such and ends that N's run for that mode.

    python bench/rendezvous_scale.py [--quick] [--sizes 16,64,256] [--png docs/img/rendezvous_scale.png]

The last line is ``RESULT n=<the largest N both modes completed> form_ours_s=...
reform1_ours_s=<median> reform1_plain_s=... reform1_worst_ours_s=... reform8_ours_s=...
speedup=<plain / ours, medians after one death> largest_ours=<largest N it completed>
largest_plain=...``.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "common"), str(ROOT / "trainer_image")]
from _common import parser, result  # noqa: E402

from llmtrain_contract.ports import free_ports  # noqa: E402

PY = sys.executable
AGENTS = ROOT / "bench" / "_rdzv_agents.py"
CLK = os.sysconf("SC_CLK_TCK")
PLAIN_STORE = ("import datetime, signal, sys, threading\n"
               "from torch.distributed import TCPStore\n"
               "s = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False,\n"
               "             timeout=datetime.timedelta(hours=1), use_libuv=True)\n"
               "print('up', flush=True)\n"
               "signal.sigwait({signal.SIGTERM})\n")


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Phase:
    name: str
    seconds: float | None
    """None: not within the timeout."""
    joined: int
    errors: list[str] = field(default_factory=list)
    store_cpu: float = 0.0


@dataclass
class Run:
    mode: str
    n: int
    phases: list[Phase] = field(default_factory=list)
    store_peak_mb: float = 0.0
    note: str = ""

    def seconds(self, name: str, worst: bool = False) -> float | None:
        """The median of the phase's rounds (``worst``: the longest); None when one did not
        complete."""
        times = [p.seconds for p in self.phases if p.name == name]
        if not times or any(t is None for t in times):
            return None
        done = sorted(t for t in times if t is not None)
        return done[-1] if worst else statistics.median(done)


class Agents:
    """The agent processes of one run, and the events they print."""

    def __init__(self, mode: str, n: int, port: int, token: str, per_process: int, min_nodes: int):
        self.events: list[tuple[float, dict]] = []
        self.cond = threading.Condition()
        self.procs = []
        run_id = f"bench-{mode}-{n}"
        for first in range(0, n, per_process):
            count = min(per_process, n - first)
            proc = subprocess.Popen([PY, str(AGENTS), "--mode", mode, "--port", str(port), "--run-id", run_id,
                                     "--first", str(first), "--count", str(count), "--min-nodes", str(min_nodes),
                                     "--max-nodes", str(n), "--token", token],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            self.procs.append((proc, count))
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                self.events.append((time.monotonic(), event))
                self.cond.notify_all()

    def send(self, commands: list[str]) -> float:
        """One command to each process (``commands[i]`` to process i); the time sent."""
        at = time.monotonic()
        for (proc, _), command in zip(self.procs, commands):
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        return at

    def wait(self, since: int, key: str, count: int, timeout: float) -> tuple[list[tuple[float, dict]], list[str]]:
        """The events ``key`` after index ``since`` once ``count`` of them came (or the
        timeout); and the errors meanwhile."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [(t, e) for t, e in self.events[since:] if key in e]
                errors = [e["error"] for _, e in self.events[since:] if "error" in e]
                if len(got) >= count or errors or time.monotonic() >= deadline:
                    return got, errors
                self.cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        for proc, _ in self.procs:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
            except OSError:
                pass
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one_run(mode: str, n: int, per_process: int, timeout: float, rounds: int, store_log_shown: bool = False) -> Run:
    run = Run(mode, n)
    port = free_ports(2)
    token = secrets.token_hex(32)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "trainer_image"), str(ROOT / "common")])}
    if mode == "ours":
        env["LLMTRAIN_RDZV_TOKEN"] = token
        cmd = [PY, "-m", "llmtrain_trainer.rendezvous.store", "--host", "127.0.0.1", "--port", str(port), "--run-id", f"bench-ours-{n}"]
    else:
        cmd = [PY, "-c", PLAIN_STORE, str(port)]
    store = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    store_log: list[str] = []
    threading.Thread(target=lambda: store_log.extend(store.stdout), daemon=True).start()
    agents = None
    try:
        deadline = time.monotonic() + 60
        while not any(("listening" in line or line.strip() == "up") for line in store_log):
            if store.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {mode} store did not start: {''.join(store_log)[-2000:]}")
            time.sleep(0.05)
        agents = Agents(mode, n, port, token, per_process, max(1, n - rounds - 8))
        ready, errors = agents.wait(0, "ready", len(agents.procs), timeout)
        if errors or len(ready) < len(agents.procs):
            run.note = f"agents not ready: {errors[:1] or 'timeout'}"
            return run
        alive = n
        for name, victims in (("form", 0), *(("reform_after_1", 1),) * rounds, ("reform_after_8", 8)):
            since = len(agents.events)
            cpu0 = cpu_seconds(store.pid)
            if victims == 0:
                at = agents.send(["form"] * len(agents.procs))
            else:
                # The victims come from the first processes' agents still alive.
                commands, left = [], victims
                for _, count in agents.procs:
                    take = min(left, count)
                    commands.append(f"kill {take}")
                    left -= take
                at = agents.send(commands)
                alive -= victims
            joined, errors = agents.wait(since, "joined", alive, timeout)
            worlds = {e["world"] for _, e in joined}
            done = len(joined) >= alive and not errors and worlds == {alive}
            phase = Phase(name, (max(t for t, _ in joined) - at) if done else None, len(joined), errors[:3],
                          cpu_seconds(store.pid) - cpu0)
            run.phases.append(phase)
            shown = f"{phase.seconds:.2f} s" if phase.seconds is not None else f"NOT within {timeout:.0f} s"
            first = f", the first after {min(t for t, _ in joined) - at:.2f} s" if joined else ""
            say(f"  {mode:5s} N={n:5d} {name:15s} {shown:>14s}  ({len(joined)}/{alive} joined{first}, worlds {sorted(worlds)[:3]}, "
                f"store CPU {phase.store_cpu:.2f} s){' errors: ' + '; '.join(errors[:2]) if errors else ''}")
            if not done:
                run.note = f"{name} not completed"
                break
        run.store_peak_mb = peak_mb(store.pid)
        if store_log_shown:
            say("".join(store_log)[-4000:])
        return run
    finally:
        if agents is not None:
            agents.close()
        store.terminate()
        try:
            store.wait(timeout=10)
        except subprocess.TimeoutExpired:
            store.kill()


def plot(runs: list[Run], png: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, phase in zip(axes, ("form", "reform_after_1", "reform_after_8")):
        for mode, style in (("ours", "o-"), ("plain", "s--")):
            points = [(r.n, r.seconds(phase)) for r in runs if r.mode == mode and r.seconds(phase) is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_title(phase.replace("_", " "))
        ax.set_xlabel("agents (N)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("seconds, by the bench's clock")
    axes[0].legend()
    fig.suptitle("c10d rendezvous at N agents: the project's store vs a plain TCPStore")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> int:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,64,256", help="comma-separated N (default 16,64,256; 1024 is the issue's target)")
    p.add_argument("--agents-per-process", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5, help="single deaths per N, each timed to its re-formed round")
    p.add_argument("--timeout", type=float, default=300.0, help="longest wait for one phase, seconds")
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--store-log", action="store_true",
                   help="print each store's log after its run (the rounds it completed, the agents released)")
    args = p.parse_args()
    sizes = [16] if args.quick else [int(s) for s in args.sizes.split(",") if s.strip()]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the stores hold two connections per agent
    say(f"machine: {os.cpu_count()} CPUs; sizes {sizes}; {args.agents_per_process} agents per process at most")
    runs = []
    for n in sizes:
        for mode in ("ours", "plain"):
            run = one_run(mode, n, args.agents_per_process, args.timeout, 2 if args.quick else args.rounds, args.store_log)
            def secs(x: float | None) -> str:
                return f"{x:.2f} s" if x is not None else "not completed"

            say(f"{mode} N={n}: formed {secs(run.seconds('form'))}; re-formed after one death: median "
                f"{secs(run.seconds('reform_after_1'))}, worst {secs(run.seconds('reform_after_1', worst=True))}; after 8: "
                f"{secs(run.seconds('reform_after_8'))}; store peak {run.store_peak_mb:.0f} MB{' (' + run.note + ')' if run.note else ''}")
            runs.append(run)
    if args.png is not None:
        plot(runs, args.png)
        say(f"plot: {args.png}")
    def complete(run: Run) -> bool:
        return not run.note and all(p.seconds is not None for p in run.phases)

    both = [n for n in sizes if all(complete(r) for r in runs if r.n == n)]
    largest = max(both) if both else min(sizes)
    ours = next(r for r in runs if r.mode == "ours" and r.n == largest)
    plain = next(r for r in runs if r.mode == "plain" and r.n == largest)

    def value(x: float | None) -> float | str:
        return x if x is not None else "timeout"

    def formed_up_to(mode: str) -> int:
        return max((r.n for r in runs if r.mode == mode and complete(r)), default=0)

    o1, p1 = ours.seconds("reform_after_1"), plain.seconds("reform_after_1")
    result(n=largest, form_ours_s=value(ours.seconds("form")), form_plain_s=value(plain.seconds("form")),
           reform1_ours_s=value(o1), reform1_plain_s=value(p1), reform1_worst_ours_s=value(ours.seconds("reform_after_1", worst=True)),
           reform1_worst_plain_s=value(plain.seconds("reform_after_1", worst=True)),
           reform8_ours_s=value(ours.seconds("reform_after_8")), reform8_plain_s=value(plain.seconds("reform_after_8")),
           speedup=(p1 / o1) if o1 and p1 else "n/a", largest_ours=formed_up_to("ours"), largest_plain=formed_up_to("plain"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
