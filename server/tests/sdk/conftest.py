"""Fixtures for the OpenAI SDK tests: a reprise-sim upstream and a reprise gateway, as real processes."""

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("REPRISE_BIN_DIR", ROOT / "target" / "debug"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {seconds}s")


@pytest.fixture(scope="session")
def sim_url():
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN_DIR / "reprise-sim"), "--listen", f"127.0.0.1:{port}",
         "--ttft-ms", "20", "--itl-ms", "1", "--tokens", "12"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def gateway_url(sim_url):
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="reprise-sdk-")
    proc = subprocess.Popen(
        [str(BIN_DIR / "reprise"), "serve", "--listen", f"127.0.0.1:{port}",
         "--upstream-url", sim_url, "--data-dir", data_dir, "--admin-token", "sdk-admin"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, "gateway must exit 0 on SIGTERM"
