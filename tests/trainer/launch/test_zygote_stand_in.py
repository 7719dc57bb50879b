"""The stand-in's side of the fork server's protocol (``llmtrain_trainer.pod.standin.run_forked``)
against a scripted server: no server means "train here", the rank's end is mirrored (exit
code or signal), and signals sent to the stand-in reach the rank. The real server under
torchrun is tested in tests/trainer/runs/test_zygote.py."""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmtrain_trainer.launch import zygote
from llmtrain_trainer.pod import standin

STAND_IN = "import sys; from llmtrain_trainer.pod.standin import run_forked; code = run_forked(sys.argv[1], ['x']); " \
           "print('none' if code is None else code, flush=True); sys.exit(0 if code is None else code)"


def test_only_the_builtin_trainer_gets_a_server():
    assert zygote.runs_builtin_trainer(["torchrun", "--nproc-per-node=2", "-m", "llmtrain_trainer", "--config", "c"])
    assert not zygote.runs_builtin_trainer(["torchrun", "--nproc-per-node=2", "train.py", "-m", "x"])
    assert not zygote.runs_builtin_trainer(["torchrun", "-m", "mypackage.llmtrain_trainer"])
    assert not zygote.runs_builtin_trainer(["torchrun", "llmtrain_trainer"])


def test_no_server_at_the_path_means_train_here(tmp_path):
    assert standin.run_forked(str(tmp_path / "missing"), ["x"]) is None


class _Script:
    """A server that answers one stand-in as told: ``on_request(conn, request)``."""

    def __init__(self, folder: Path, on_request):
        self.path = str(folder / "sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.request: dict | None = None
        self.thread = threading.Thread(target=self._serve, args=(on_request,), daemon=True)
        self.thread.start()

    def _serve(self, on_request):
        conn, _ = self.listener.accept()
        data, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(12))
        for _, _, payload in ancdata:  # the stand-in's streams: held, its output would never end
            for fd in array.array("i", payload[:len(payload) - len(payload) % 4]):
                os.close(fd)
        self.request = json.loads(data)
        on_request(conn, self.request)

    def close(self):
        self.listener.close()


def _catches(pid: int, sig: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _stand_in(path: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", STAND_IN, path], stdout=subprocess.PIPE, text=True)


def test_a_server_that_closes_before_the_pid_means_train_here(tmp_path):
    script = _Script(tmp_path, lambda conn, _: conn.close())
    proc = _stand_in(script.path)
    out, _ = proc.communicate(timeout=30)
    script.close()
    assert (proc.returncode, out.strip()) == (0, "none")
    assert script.request is not None and script.request["argv"] == ["x"]


@pytest.mark.parametrize("end, expected", [({"exit": 7}, 7), ({"signal": int(signal.SIGKILL)}, -signal.SIGKILL),
                                           ({"signal": int(signal.SIGTERM)}, -signal.SIGTERM)])
def test_the_rank_s_end_is_the_stand_in_s(tmp_path, end, expected):
    def answer(conn, _):
        conn.send(json.dumps({"pid": 999999}).encode())
        time.sleep(0.2)
        conn.send(json.dumps(end).encode())

    script = _Script(tmp_path, answer)
    proc = _stand_in(script.path)
    proc.communicate(timeout=30)
    script.close()
    assert proc.returncode == expected


def test_signals_to_the_stand_in_reach_the_rank_and_a_lost_server_kills_it(tmp_path):
    rank = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                             "signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n"
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    release = threading.Event()

    def answer(conn, _):
        conn.send(json.dumps({"pid": rank.pid}).encode())
        release.wait(30)
        conn.close()  # the server died: the stand-in must not leave its rank behind

    script = _Script(tmp_path, answer)
    proc = _stand_in(script.path)
    deadline = time.monotonic() + 30
    # The stand-in installs its handlers once it has the pid; the rank, once started: a
    # signal forwarded before the rank's handler would end it by the default action.
    while not (_catches(proc.pid, signal.SIGUSR1) and _catches(rank.pid, signal.SIGUSR1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    assert rank.stdout.readline().strip() == "usr1"
    release.set()
    proc.communicate(timeout=30)
    script.close()
    assert proc.returncode == 1
    assert rank.wait(timeout=30) == -signal.SIGKILL
