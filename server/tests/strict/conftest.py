"""Fixtures for the strict-upstream tests: the aiohttp upstream and a reprise gateway in front of it,
as real processes (`REPRISE_BIN_DIR` names the gateway's build, like the SDK tests)."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import BIN_DIR, free_port, wait_ready  # noqa: E402  (after the path it needs)
HERE = Path(__file__).resolve().parent

UPSTREAM_KEY = "sk-strict-upstream-key"
CLIENT_KEY = "sk-client-must-not-leak"
CLIENT_AZURE_KEY = "azure-client-must-not-leak"
CLIENT_ANTHROPIC_KEY = "anthropic-client-must-not-leak"
ADMIN = "strict-admin"


@pytest.fixture(scope="session")
def upstream():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "strict_upstream.py"), "--port", str(port), "--api-key", UPSTREAM_KEY,
         "--client-secret", CLIENT_KEY, "--client-secret", CLIENT_AZURE_KEY,
         "--client-secret", CLIENT_ANTHROPIC_KEY],
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/_strict/healthz", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def gateway(upstream):
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="reprise-strict-")
    proc = subprocess.Popen(
        [str(BIN_DIR / "reprise"), "serve", "--listen", f"127.0.0.1:{port}",
         "--upstream-url", f"{upstream}/v1", "--upstream-api-key", UPSTREAM_KEY,
         "--data-dir", data_dir, "--admin-token", ADMIN, "--semantic", "false"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, "gateway must exit 0 on SIGTERM"
