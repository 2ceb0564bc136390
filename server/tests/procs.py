"""Process helpers shared by the Python test suites (sdk/, strict/): free ports, readiness, the build's binaries."""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def models_dir() -> Path | None:
    """The provisioned embedding model folder (REPRISE_MODELS_DIR, else ./models), or None when it is missing.

    Missing is a failure when CI is set: semantic tests must run there, not skip quietly."""
    root = Path(os.environ.get("REPRISE_MODELS_DIR", ROOT / "models"))
    if (root / "all-MiniLM-L6-v2" / "model.onnx").exists():
        return root
    if os.environ.get("CI"):
        raise RuntimeError(f"the embedding model is missing from {root} and CI is set: run scripts/provision-models.sh")
    return None


def semantic_args(models: Path | None) -> list[str]:
    """`reprise serve` flags that load the model from `models`, or turn semantic matching off without one."""
    if models is None:
        return ["--semantic", "false"]
    return ["--model-dir", str(models / "all-MiniLM-L6-v2"),
            "--ort-lib", str(models / "onnxruntime" / "libonnxruntime.so")]
