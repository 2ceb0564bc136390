"""Fixtures for the framework tests: one reprise-sim upstream (OpenAI's API and Anthropic's Messages API, both through
the gateway) and one reprise gateway (with the embedding model, so paraphrases can hit) as real processes, shared by
every client the tests drive (the official SDKs, LangChain, the OpenAI Agents SDK). Each test asks under its own API
key, and the key is the tenant, so tests never share entries."""

import itertools
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import BIN_DIR, free_port, models_dir, semantic_args, wait_ready  # noqa: E402  (after the path it needs)

ADMIN_TOKEN = "frameworks-admin"


class Stack:
    """The running gateway as the tests see it: its URL, a fresh tenant per call of `key`, and the store's counts."""

    def __init__(self, url: str, semantic: bool):
        self.url = url
        self.base_url = url + "/v1"
        self.semantic = semantic
        self._keys = itertools.count(1)

    def key(self, label: str) -> str:
        """An API key no other test uses: its own tenant, so its first request is a miss whatever ran before."""
        return f"sk-fw-{label}-{next(self._keys)}"

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
            return json.load(r)

    def stored(self) -> int:
        return self.health()["entries"]

    def wait_stored(self, before: int, seconds: float = 20.0) -> None:
        """Waits until the store holds more than `before` entries and, with semantic matching on, every entry has
        its vector in the index. Entries are written off the request path, after the client has its last byte, so
        a test that wants a hit waits for the write instead of retrying (a retry that missed would store itself)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            h = self.health()
            indexed = not self.semantic or (
                h["semantic"]["vectors"] >= h["entries"] and h["semantic"]["backfill_pending"] == 0
            )
            if h["entries"] > before and indexed:
                return
            time.sleep(0.02)
        raise AssertionError(f"no new entry stored (and indexed) within {seconds}s: {self.health()}")

    def requests(self, limit: int = 20) -> list[dict]:
        """The gateway's newest request records (`GET /admin/requests`), newest first."""
        req = urllib.request.Request(
            f"{self.url}/admin/requests?limit={limit}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)["data"]

    def record(self, request_id: str, seconds: float = 10.0) -> dict:
        """The gateway's record of one request, by its x-reprise-request-id (a stream's lands after its last byte)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            found = [r for r in self.requests(limit=50) if r["id"] == request_id]
            if found:
                return found[0]
            time.sleep(0.02)
        raise AssertionError(f"{request_id} is not in /admin/requests after {seconds}s")

    def reply_from_record(self, seen: set[str], text: str, seconds: float = 10.0):
        """A Reply for a client that keeps the response headers to itself: the outcome and id of the one request
        recorded since `seen` (the ids in /admin/requests before the call; tests ask one at a time)."""
        from clients import Reply

        deadline = time.time() + seconds
        while time.time() < deadline:
            new = [r for r in self.requests(limit=50) if r["id"] not in seen]
            if new:
                assert len(new) == 1, f"expected one request to the gateway, saw {new}"
                return Reply(new[0]["cache"], text, new[0]["id"])
            time.sleep(0.02)
        raise AssertionError(f"no new request in /admin/requests after {seconds}s")

    def require_semantic(self) -> None:
        """Semantic tests skip without the model outside CI (`models_dir` already failed the run under CI)."""
        if not self.semantic:
            pytest.skip("no embedding model (run scripts/provision-models.sh); semantic hits not tested")


@pytest.fixture(scope="session")
def stack():
    models = models_dir()
    procs = []
    try:
        sim_port = free_port()
        sim = subprocess.Popen(
            [str(BIN_DIR / "reprise-sim"), "--listen", f"127.0.0.1:{sim_port}",
             "--ttft-ms", "20", "--itl-ms", "1", "--tokens", "12"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(sim)
        wait_ready(f"http://127.0.0.1:{sim_port}/healthz", sim)

        gw_port = free_port()
        gateway = subprocess.Popen(
            [str(BIN_DIR / "reprise"), "serve", "--listen", f"127.0.0.1:{gw_port}",
             "--upstream-url", f"http://127.0.0.1:{sim_port}/v1",
             "--anthropic-upstream-url", f"http://127.0.0.1:{sim_port}/v1",
             "--data-dir", tempfile.mkdtemp(prefix="reprise-frameworks-"), "--admin-token", ADMIN_TOKEN,
             # A slow, shared CI machine must not turn a paraphrase into an exact-only lookup.
             "--embed-deadline-ms", "5000", "--embed-queue-budget-ms", "1000",
             *semantic_args(models)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(gateway)
        url = f"http://127.0.0.1:{gw_port}"
        wait_ready(url + "/healthz", gateway, seconds=60)
        s = Stack(url, semantic=models is not None)
        if models is not None:
            assert s.health()["mode"] == "semantic", f"the model did not load: {s.health()}"
        yield s
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=20)
