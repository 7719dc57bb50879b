"""A real S3-compatible server on loopback for tests and benchmarks: MinIO, built from its
Go module by ``hack/cluster-tools/build.sh`` (pinned in ``hack/cluster-tools/minio``).

    with MinioServer(tmp_path) as s3:
        s3.make_bucket("ckpt")
        env = s3.env()          # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL

``stop()`` and ``start()`` take it down and bring it back on the same port and data
(an outage); ``env(secret=...)`` gives wrong credentials.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster.cluster import build_tools

ACCESS_KEY = "llmtrain-test"
SECRET_KEY = "llmtrain-test-secret-0123456789"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MinioServer:
    def __init__(self, root: Path, port: int | None = None, binary: Path | None = None, host: str = "127.0.0.1"):
        """``host``: the address to listen on (``0.0.0.0`` to be reached from network
        namespaces); clients here use loopback either way."""
        self.root = Path(root)
        self.host = host
        self.data = self.root / "minio-data"
        self.port = port or _free_port()
        self.binary = binary or build_tools("minio") / "minio"
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "minio.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> MinioServer:
        self.data.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CI_CD": "1"}
        console = _free_port()
        with self.log.open("a") as fh:
            self.proc = subprocess.Popen(
                [str(self.binary), "server", str(self.data), "--address", f"{self.host}:{self.port}",
                 "--console-address", f"127.0.0.1:{console}", "--quiet"],
                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"minio exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as response:  # noqa: S310 - our http endpoint
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"minio did not become ready in {timeout:.0f}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self, secret: str = SECRET_KEY) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_DEFAULT_REGION": REGION}

    def client(self) -> Any:
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, config=Config(s3={"addressing_style": "path"}),
        )

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out
