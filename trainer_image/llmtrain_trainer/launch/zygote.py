"""The pod's fork server: torch is imported once per pod, not once per rank and restart.

torchrun starts every rank as a new ``python -m llmtrain_trainer``. Importing torch and the
trainer costs about 3 s of CPU on a small node (torch._dynamo, which the optimizer needs,
2 s more), and that sits on the critical path of every in-place restart: a crash, a hang,
a rollback, a peer's replacement. The launcher binds a Unix socket and starts this server
beside torchrun (``start``); the server imports once and then forks, for each rank, a
child that runs the trainer with that rank's arguments, environment, working directory
and standard streams (``serve``).

The process torchrun started becomes the rank's stand-in (``run_forked``, called first
thing by ``__main__``): it forwards signals to the child and exits as the child did (the
same code, or killed by the same signal), so torchrun, the supervisor, the exit records
and the heartbeat files (written by the child, with its pid) see what they saw before.
When the stand-in dies (torchrun kills its process group), the server kills the child; when
the server dies, its children die with it (``PR_SET_PDEATHSIG``) and the stand-ins exit.

Fork safety: the server forks only while it runs a single Python thread and no CUDA
context (it imports with torch's NVML-based CUDA check, which creates none), and checks
both before it serves; otherwise it refuses and every rank imports on its own, as it does
when no server answers at all (the stand-in then runs the trainer in its own process).
Environment variables torchrun sets per rank (``RANK``, ``MASTER_ADDR``, ...) are read by
torch when the process group starts, after the fork, so a forked rank sees its own.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from llmtrain_contract.names import Env

from llmtrain_trainer.pod.standin import FORWARDED, MAX_MESSAGE

RANK_PROGRAM = "llmtrain_trainer.train.main"
"""The program a forked child runs, by module name, as ``python -m llmtrain_trainer``
would (``__main__.py``): the server is a generic pre-importing fork server, and the
launcher side it belongs to never imports the rank side."""
FIRST_STAGE = ("torch", "torch.distributed", RANK_PROGRAM, "llmtrain_trainer.train.dist", "llmtrain_trainer.train.loop",
               "llmtrain_trainer.checkpoint.restore", "llmtrain_trainer.engines.data", "llmtrain_trainer.train.metrics")
"""Imported before the server answers: what every rank needs before its first collective."""
SECOND_STAGE = ("torch._dynamo",)
"""Imported once the server has been idle for a second: a rank also imports these in a
thread of its own (``main._warm_imports``) overlapping the process group's start, so a
rank forked before they are loaded waits for nothing."""
IDLE_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1


def runs_builtin_trainer(command: list[str]) -> bool:
    """Whether ``command`` (torchrun's) runs the built-in trainer. A user's script gets no
    server: it may import other things, or set variables torch reads at import."""
    return any(arg == "-m" and nxt == "llmtrain_trainer" for arg, nxt in zip(command, command[1:]))


class Server:
    """The launcher's handle on a started server."""

    def __init__(self, proc: Any, folder: Path):
        self.proc, self.folder = proc, folder
        self.socket = str(folder / "sock")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for path in self.folder.iterdir():
            path.unlink(missing_ok=True)
        self.folder.rmdir()


def start(python: str = sys.executable) -> Server | None:
    """Bind the socket (so that a rank which starts before the server has imported still
    connects, and waits) and start the server on it. None when no socket can be made: the
    ranks then start on their own."""
    import subprocess  # noqa: PLC0415 - the stand-in's path never needs it

    try:
        folder = Path(tempfile.mkdtemp(prefix="llmtrain-zygote-"))  # 0700: only this user connects
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(folder / "sock"))
        listener.listen(64)
    except OSError as err:
        print(f"llmtrain launcher: no fork server ({err}); every rank imports torch itself", file=sys.stderr, flush=True)
        return None
    try:
        # Without the job's token: its ranks, forked from it, have no use for it (the
        # torchrun agent keeps it from the ranks it starts itself, too).
        env = {k: v for k, v in os.environ.items() if k != Env.RDZV_TOKEN}
        proc = subprocess.Popen([python, "-m", "llmtrain_trainer.launch.zygote", "--fd", str(listener.fileno())],
                                pass_fds=[listener.fileno()], env=env)
    finally:
        listener.close()  # the server holds it now; if it dies, connecting fails and ranks start on their own
    return Server(proc, folder)


# ----------------------------------------------------------------------------- server


def _set_parent_death_signal(sig: int) -> None:
    import ctypes  # noqa: PLC0415

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _import(names: tuple[str, ...]) -> None:
    import importlib  # noqa: PLC0415

    for name in names:
        importlib.import_module(name)


def _forkable() -> bool:
    """One Python thread and no CUDA context: what a forked child can safely inherit."""
    import torch  # noqa: PLC0415 - imported already

    return threading.active_count() == 1 and not torch.cuda.is_initialized()


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass  # the stand-in is gone; its child is killed when its connection reads as closed


def _peer_pid(conn: socket.socket) -> tuple[int, int]:
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _receive_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    try:
        return json.loads(data), list(fds)
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise


def _run_child(request: dict[str, Any], fds: list[int], stand_in: int) -> None:
    """In the forked child: become the rank and never return."""
    code = 1
    try:
        _set_parent_death_signal(signal.SIGKILL)
        for sig in (*FORWARDED, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        # As a Python started by exec has it: a write to a closed socket raises EPIPE
        # instead of killing the rank (a scraper or the operator's probe that timed out
        # and hung up before the metrics response was written killed ranks at start-up).
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        for target, fd in zip(request["streams"], fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd not in request["streams"]:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[Env.FORKED_FOR] = str(stand_in)
        sys.argv = list(request["argv"])
        import random  # noqa: PLC0415

        random.seed()  # not the server's state: every child would draw the same numbers
        import torch  # noqa: PLC0415 - already imported: a dictionary lookup

        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # read at import, before torchrun set it
        import importlib  # noqa: PLC0415

        code = importlib.import_module(RANK_PROGRAM).main(sys.argv[1:])
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 - the rank's own error, reported as a crash would be
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


class _Loop:
    """Single-threaded: accepts, forks, and reports each child's end to its stand-in."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, ("accept", None))
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (connection, pidfd)
        self._orphans: set[int] = set()  # children whose stand-in is gone

    def run(self) -> None:
        pending = list(SECOND_STAGE)
        while True:
            events = self.selector.select(timeout=IDLE_SECONDS if pending else None)
            if not events and pending:
                _import(tuple(pending))
                pending = []
                if not _forkable():
                    print("llmtrain zygote: a thread or CUDA started while importing; no more forks", file=sys.stderr, flush=True)
                    self.selector.unregister(self.listener)
                    self.listener.close()
                continue
            for key, _ in events:
                what, pid = key.data
                if what == "accept":
                    self._accept()
                elif what == "exited":
                    self._reap(pid)
                else:
                    self._stand_in_gone(pid)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        stand_in, uid = _peer_pid(conn)
        if uid != os.getuid():
            conn.close()
            return
        try:
            conn.settimeout(10)
            request, fds = _receive_request(conn)
        except (OSError, ValueError):
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as err:  # out of memory or processes: the stand-in sees no pid and trains itself
            print(f"llmtrain zygote: cannot fork ({err})", file=sys.stderr, flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        if pid == 0:
            self.listener.close()
            for other, pidfd in self.children.values():
                other.close()
                os.close(pidfd)
            self.selector.close()
            conn.close()
            _run_child(request, fds, stand_in)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = (conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
        self.selector.register(conn, selectors.EVENT_READ, ("stand-in", pid))
        _send(conn, {"pid": pid})

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _send(conn, {"signal": -code} if code < 0 else {"exit": code})
        self.selector.unregister(pidfd)
        if pid not in self._orphans:
            self.selector.unregister(conn)
        self._orphans.discard(pid)
        os.close(pidfd)
        conn.close()

    def _stand_in_gone(self, pid: int) -> None:
        conn, _ = self.children[pid]
        try:
            if conn.recv(1):
                return
        except OSError:
            pass
        # torchrun killed the stand-in (its process group): the rank goes with it. The
        # pidfd reports the exit, which is then sent nowhere.
        self.selector.unregister(conn)
        self._orphans.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def serve(fd: int) -> int:
    _set_parent_death_signal(signal.SIGKILL)  # the launcher's end is the server's
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # a pod-wide SIGTERM is for the ranks; the launcher ends the server
    listener = socket.socket(fileno=fd)
    # CUDA does not survive a fork once initialised. torch.cuda.is_available() answers from
    # NVML with this set, which leaves the server forkable; the forked ranks get their own
    # environment back and check CUDA as usual.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        _import(FIRST_STAGE)
    except Exception as err:  # noqa: BLE001 - the ranks then import on their own, and fail there if they must
        print(f"llmtrain zygote: import failed ({err}); every rank imports torch itself", file=sys.stderr, flush=True)
        return 1
    if not _forkable():
        print("llmtrain zygote: importing started a thread or CUDA; forking would be unsafe, every rank imports torch itself",
              file=sys.stderr, flush=True)
        return 1
    try:
        os.close(os.pidfd_open(os.getpid()))  # Linux 5.3 and later; older kernels get no server
    except (AttributeError, OSError) as err:
        print(f"llmtrain zygote: no pidfd ({err}); every rank imports torch itself", file=sys.stderr, flush=True)
        return 1
    _Loop(listener).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrain_trainer.launch.zygote")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket the launcher bound")
    args = parser.parse_args(argv)
    return serve(args.fd)


if __name__ == "__main__":
    sys.exit(main())
