"""Fixtures for the OpenAI SDK tests: a reprise-sim upstream and a reprise gateway, as real processes."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import BIN_DIR, free_port, wait_ready  # noqa: E402  (after the path it needs)


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
