"""scripts/quickstart.sh refuses a taken port before it builds or starts anything, naming the program
that holds it (when `ss` can tell) and the variable that picks another port."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import ROOT, free_port, wait_ready  # noqa: E402  (after the path it needs)


@pytest.fixture
def squatter():
    """An unrelated HTTP server on a loopback port, as Prometheus on 9090 would be."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def quickstart(**env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPRISE_")}
    return subprocess.run([str(ROOT / "scripts" / "quickstart.sh")], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("variable", ["REPRISE_SIM_LISTEN", "REPRISE_LISTEN"])
def test_a_taken_port_is_refused_before_anything_starts(squatter, variable):
    port, pid = squatter
    taken = f"127.0.0.1:{port}"
    free = {port}
    while len(free) < 3:
        free.add(free_port())
    gateway, sim = sorted(free - {port})
    env = {"REPRISE_LISTEN": f"127.0.0.1:{gateway}", "REPRISE_SIM_LISTEN": f"127.0.0.1:{sim}"}
    env[variable] = taken
    run = quickstart(**env)
    assert run.returncode == 1, run.stdout + run.stderr
    # Refused before provisioning or the build: nothing of either was printed.
    assert "==>" not in run.stdout, run.stdout
    assert f"{taken}, where" in run.stderr and "is taken" in run.stderr, run.stderr
    assert f"{variable}=127.0.0.1:{port + 1} scripts/quickstart.sh" in run.stderr, run.stderr
    if shutil.which("ss"):
        assert f"(pid {pid})" in run.stderr and "python" in run.stderr, run.stderr
