"""Fault injection, FOR TESTS ONLY.

Off unless the environment variable ``LLMTRAIN_FAULT_INJECT`` is set. Its value is a
``;``-separated list of faults::

    crash@step=25,rank=1          SIGKILL this process at the start of step 25 on rank 1
    hang@step=30,rank=0           block forever (as a stuck collective would)
    slow@step=10,rank=0,seconds=2 sleep 2 s in step 10
    slow@step=14,seconds=60,until=go
                                  pause step 14 for up to 60 s, less once a file ``go``
                                  appears in the run dir (a test resumes it when ready)
    slow@step=20,seconds=1,steps=70
                                  pace every rank: each of steps 20..89 takes >= 1 s
                                  (every time it runs; tests that must outlast a failure)
    slow@step=1,seconds=0.5,steps=1000,until=release
                                  the same pacing, ended early once a file ``release``
                                  appears in the run dir (a test paces a job through its
                                  faults, then lets it finish)
    slow@step=0,seconds=6,attempt=1
                                  step 0 is start-up: sleep 6 s before the process group
                                  starts, in torchrun's first restart only
    exit@step=5,rank=0,code=64    exit with a given code
    sigterm@step=12,rank=0        send SIGTERM to this process (emergency checkpoint path)
    stop@step=15,rank=1           SIGSTOP this process (frozen: its own threads stop too)
    stop@step=15,rank=0,target=agent
                                  SIGSTOP the torchrun agent (target=launcher: the launcher)
    gil@step=15,rank=1            hold the GIL in native code: a catastrophic regular
                                  expression that runs for hours without releasing it
    oom@step=15,rank=1            grow this process until the kernel's OOM killer ends it
                                  (the container's memory limit; refused without one, so
                                  that a test never fills the machine)
    gpu_oom@step=15,rank=1        run out of GPU memory: on a GPU, ask CUDA's allocator
                                  for twice the device (a real ``torch.OutOfMemoryError``);
                                  without one, raise that error with torch's own words
    nan@step=15,rank=0            set a parameter of this rank to NaN before step 15:
                                  its loss, then every rank's gradients, weights and
                                  loss turn NaN (bad numerics)

``at=agree``: the fault fires after the step's optimizer update, right before the
per-step agreement, instead of at the start of the step (a rank stopped there leaves its
peers blocked in the agreement with their state one step further).

``trigger=NAME`` instead of (or with) ``step``: the fault fires at the first step (from
``step``, default 1) that starts after a file ``NAME`` appears in the run dir, so that a
benchmark injects it at a moment of its own clock (``gil@trigger=go,rank=1``).

Each fault fires at most once per job: before firing, a marker is written into
``LLMTRAIN_FAULT_STATE_DIR`` (default: the run dir), so a restarted worker that replays
step 25 does not crash again. ``attempt=N`` restricts a fault to torchrun's Nth restart.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmtrain_contract.names import Env

from llmtrain_trainer.pod import memcg

ENV = Env.FAULT_INJECT
STATE_ENV = Env.FAULT_STATE_DIR
KINDS = {"crash", "hang", "slow", "exit", "sigterm", "stop", "gil", "nan", "oom", "gpu_oom"}
TARGETS = ("self", "agent", "launcher")
"""What ``stop`` freezes: this rank, its torchrun agent (the parent), or the launcher."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None
    attempt: int | None = None
    params: dict[str, str] = field(default_factory=dict)
    index: int = 0


def parse(text: str) -> list[Fault]:
    faults = []
    for index, item in enumerate(p.strip() for p in text.split(";") if p.strip()):
        kind, _, rest = item.partition("@")
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault kind {kind!r} in {item!r}; use one of {sorted(KINDS)}")
        opts = dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
        if "step" not in opts and "trigger" not in opts:
            raise ValueError(f"{ENV}: fault {item!r} needs step=N or trigger=NAME")
        if opts.get("target", "self") not in TARGETS:
            raise ValueError(f"{ENV}: fault {item!r}: target must be one of {list(TARGETS)}")
        if opts.get("at", "step") not in ("step", "agree"):
            raise ValueError(f"{ENV}: fault {item!r}: at must be step or agree")
        faults.append(
            Fault(
                kind=kind,
                step=int(opts.pop("step", "1")),
                rank=int(opts.pop("rank")) if "rank" in opts else None,
                attempt=int(opts.pop("attempt")) if "attempt" in opts else None,
                params=opts,
                index=index,
            )
        )
    return faults


class FaultInjector:
    def __init__(self, faults: list[Fault], rank: int, attempt: int, state_dir: Path, run_dir: Path | None = None):
        self.faults = [f for f in faults if f.rank in (None, rank) and f.attempt in (None, attempt)]
        self.rank = rank
        self.state_dir = state_dir
        self.run_dir = run_dir or state_dir
        self._step = 0
        self.poison = False
        """Set by a ``nan`` fault: the trainer poisons a parameter before this step."""

    @classmethod
    def from_env(cls, rank: int, attempt: int, run_dir: Path) -> FaultInjector:
        text = os.environ.get(ENV, "")
        state = Path(os.environ.get(STATE_ENV, str(run_dir)))
        return cls(parse(text) if text else [], rank, attempt, state / "faults", run_dir)

    def at_step(self, step: int) -> None:
        self._step = step
        self._fire_due(step, "step")

    def before_agree(self, step: int) -> None:
        """After ``step``'s optimizer update, before its agreement (``at=agree`` faults)."""
        self._fire_due(step, "agree")

    def _fire_due(self, step: int, point: str) -> None:
        for fault in self.faults:
            if fault.params.get("at", "step") != point:
                continue
            if fault.kind == "slow" and "steps" in fault.params:
                released = "until" in fault.params and (self.run_dir / fault.params["until"]).exists()
                if fault.step <= step < fault.step + int(fault.params["steps"]) and not released:
                    time.sleep(float(fault.params.get("seconds", "1")))  # pacing: no marker, quiet
                continue
            if "trigger" in fault.params:
                if step < fault.step or not (self.run_dir / fault.params["trigger"]).exists():
                    continue
            elif fault.step != step:
                continue
            marker = self.state_dir / f"fault-{fault.index}-rank-{self.rank}.fired"
            if marker.exists():
                continue
            self.state_dir.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(time.time()))
            self._fire(fault)

    def _pause(self, seconds: float, until: str | None) -> None:
        """Sleep ``seconds``, or less once the file ``until`` appears in the run dir."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if until is not None and (self.run_dir / until).exists():
                return
            time.sleep(min(left, 0.1) if until is not None else left)

    def _fire(self, fault: Fault) -> None:
        print(f"llmtrain: FAULT INJECTION (test only): {fault.kind} at step {self._step} on rank {self.rank}", file=sys.stderr, flush=True)
        if fault.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "hang":
            while True:
                time.sleep(3600)
        elif fault.kind == "slow":
            self._pause(float(fault.params.get("seconds", "1")), fault.params.get("until"))
        elif fault.kind == "exit":
            os._exit(int(fault.params.get("code", "1")))
        elif fault.kind == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif fault.kind == "stop":
            target = fault.params.get("target", "self")
            agent = _agent()
            pid = {"self": os.getpid(), "agent": agent, "launcher": _parent(agent)}[target]
            if pid == 1:
                # The init of this PID namespace (a container's first process): the kernel
                # drops the signal, so say so rather than pretend it froze.
                print(f"llmtrain: FAULT INJECTION: the {target} is pid 1 of its PID namespace, which ignores SIGSTOP "
                      "from inside it; freeze it from the node instead", file=sys.stderr, flush=True)
            os.kill(pid, signal.SIGSTOP)
        elif fault.kind == "nan":
            self.poison = True
        elif fault.kind == "oom":
            _grow_until_killed()
        elif fault.kind == "gpu_oom":
            _exhaust_gpu()
        elif fault.kind == "gil":
            # Nested quantifiers on a non-matching subject: exponential backtracking inside
            # the regex engine, which never releases the GIL (2**40 steps: hours).
            re.match(r"(a+)+$", "a" * 40 + "b")


def _grow_until_killed() -> None:
    """Touch 64 MiB more at a time (a repeated byte is written, so the pages count against
    the cgroup) until the OOM killer ends this process at the container's limit."""
    place = memcg.own()
    memory = memcg.read(place) if place is not None else None
    if memory is None or memory.limit_bytes is None:
        print("llmtrain: FAULT INJECTION: oom needs a container memory limit (resources.limits.memory); none found",
              file=sys.stderr, flush=True)
        os._exit(1)
    hoard = []
    while True:
        hoard.append(b"\x01" * (64 << 20))


def _exhaust_gpu() -> None:
    """Raise ``torch.OutOfMemoryError``: from CUDA's allocator itself when this rank has a
    GPU (twice its memory in one tensor), else with the words torch uses."""
    import torch  # noqa: PLC0415 - the trainer's ranks have it; the injector's other faults need none

    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        raise AssertionError("CUDA allocated twice its GPU's memory")  # unreachable on any GPU
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. (injected: this rank has no GPU)")


def _agent() -> int:
    """The torchrun agent: this process's parent, or the parent of the stand-in torchrun
    started when the fork server made this rank (zygote.py)."""
    stand_in = os.environ.get(Env.FORKED_FOR)
    return _parent(int(stand_in)) if stand_in else os.getppid()


def _parent(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])
