"""Fixtures for the Prometheus and Grafana tests: a reprise-sim upstream, a reprise gateway (with the embedding model,
so paraphrases hit and guards refuse) and a real Prometheus (Debian's `prometheus`, on a free loopback port with a
temporary storage folder, scraping the gateway every second and loading deploy/prometheus/reprise.rules.yml), all as
real processes. `traffic` sends the requests whose series the dashboard's panels read and waits until Prometheus has
scraped their counts."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import BIN_DIR, ROOT, free_port, models_dir, semantic_args, wait_ready  # noqa: E402  (after the path it needs)

ADMIN_TOKEN = "prometheus-admin"
JOB = "reprise-it"
RULES = ROOT / "deploy" / "prometheus" / "reprise.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "reprise.json"
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval): 4 s at a 1 s scrape.
SCRAPE_S = 1


def prometheus_binary() -> str:
    found = os.environ.get("REPRISE_PROMETHEUS_BINARY") or shutil.which("prometheus")
    if not found:
        raise RuntimeError("prometheus is not installed: scripts/apt-install.sh prometheus (scripts/test.sh does)")
    return found


class Prometheus:
    """The HTTP API of the running Prometheus."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{path}?{urllib.parse.unquote(query)}: {e.code} {e.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> list:
        return self.get("/api/v1/query", query=expr, time=at)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list:
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]


class Gateway:
    def __init__(self, url: str):
        self.url = url

    def admin(self, path: str) -> dict:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/healthz", timeout=10) as r:
            return json.load(r)

    def ask(self, key: str, prompt: str, stream: bool = False, headers: dict | None = None) -> tuple[int, dict]:
        """One chat completion; returns the status and the response headers (lower-cased), the body read in full."""
        body = json.dumps({"model": "sim-model", "stream": stream,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
        req = urllib.request.Request(
            self.url + "/v1/chat/completions", data=body, method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                return r.status, {k.lower(): v for k, v in r.headers.items()}
        except urllib.error.HTTPError as e:
            e.read()
            return e.code, {k.lower(): v for k, v in e.headers.items()}

    def wait_indexed(self, entries: int, seconds: float = 30.0) -> None:
        """Entries are written (and embedded) off the request path: a test that wants a hit waits for them."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            h = self.health()
            if h["entries"] >= entries and h["semantic"]["vectors"] >= entries and h["semantic"]["backfill_pending"] == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"{entries} entries not stored and indexed within {seconds}s: {self.health()}")


@pytest.fixture(scope="session")
def stack():
    models = models_dir()
    if models is None:
        # models_dir() already failed the run when CI is set; the guard and semantic panels need the model.
        pytest.skip("no embedding model (run scripts/provision-models.sh): the semantic panels cannot have data")
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="reprise-prometheus-"))
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
             "--data-dir", str(tmp / "data"), "--admin-token", ADMIN_TOKEN,
             # A slow, shared CI machine must not turn a paraphrase into an exact-only lookup.
             "--embed-deadline-ms", "5000", "--embed-queue-budget-ms", "1000",
             *semantic_args(models)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(gateway)
        gw = Gateway(f"http://127.0.0.1:{gw_port}")
        wait_ready(gw.url + "/healthz", gateway, seconds=60)
        assert gw.health()["mode"] == "semantic", f"the model did not load: {gw.health()}"

        # JSON is YAML: the scrape configuration the README shows, with the admin token as bearer credentials.
        prom_port = free_port()
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{
                "job_name": JOB,
                "authorization": {"type": "Bearer", "credentials": ADMIN_TOKEN},
                "static_configs": [{"targets": [f"127.0.0.1:{gw_port}"]}],
            }],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        prom = subprocess.Popen(
            [prometheus_binary(), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"),
        )
        procs.append(prom)
        wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", prom, seconds=60)
        yield gw, Prometheus(f"http://127.0.0.1:{prom_port}")
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


def bad_request_head(url: str) -> None:
    """A request head that is not HTTP: the gateway answers 400 and closes (`reprise_client_connections_closed_total`)."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        while s.recv(4096):
            pass


@pytest.fixture(scope="session")
def traffic(stack):
    """Sends misses, exact hits (plain and streamed), a semantic hit, a guard refusal, an upstream error and a malformed
    request head, for several seconds so that rates over Grafana's $__rate_interval see them; then waits until
    Prometheus has scraped the gateway's final counts. Returns (start, end) of the window, in Unix seconds."""
    gw, prom = stack
    deadline = time.time() + 30
    while not prom.query(f'up{{job="{JOB}"}} == 1', time.time()):
        assert time.time() < deadline, "Prometheus never scraped the gateway"
        time.sleep(0.2)
    start = time.time()
    # A scrape inside the window before any request: every counter's baseline (the gateway exports its
    # request counters at 0 from the start) is in the window, so increase() over it misses nothing.
    while not prom.query(f'timestamp(up{{job="{JOB}"}}) > {start}', time.time()):
        assert time.time() < deadline, "Prometheus stopped scraping the gateway"
        time.sleep(0.2)

    status, h = gw.ask("sk-a", "how do I reset my password")
    assert (status, h.get("x-reprise-cache")) == (200, "miss"), h
    status, h = gw.ask("sk-a", "Can I book an appointment for 3pm tomorrow?")
    assert (status, h.get("x-reprise-cache")) == (200, "miss"), h
    status, h = gw.ask("sk-a", "Write a haiku about the sea", stream=True)
    assert (status, h.get("x-reprise-cache")) == (200, "miss"), h
    gw.wait_indexed(3)
    # Hits, spread over several scrapes, plain and streamed.
    for _ in range(6):
        status, h = gw.ask("sk-a", "how do I reset my password")
        assert (status, h.get("x-reprise-cache")) == (200, "hit"), h
        status, h = gw.ask("sk-a", "Write a haiku about the sea", stream=True)
        assert (status, h.get("x-reprise-cache")) == (200, "hit"), h
        time.sleep(0.5)
    status, h = gw.ask("sk-a", "I forgot my password, how can I reset it")
    assert (status, h.get("x-reprise-cache")) == (200, "semantic-hit"), h
    # The numbers guard: the embedding alone would serve 3pm tomorrow's answer to a question about Friday.
    status, h = gw.ask("sk-a", "Can I book an appointment for 3pm on Friday?", headers={"cache-control": "no-store"})
    assert (status, h.get("x-reprise-cache"), h.get("x-reprise-guard")) == (200, "miss", "numbers"), h
    status, h = gw.ask("sk-a", "an upstream failure", headers={"x-sim-fault": "status=500"})
    assert status == 500, (status, h)
    bad_request_head(gw.url)
    for i in range(4):
        status, h = gw.ask("sk-b", f"fresh question number {i}")
        assert (status, h.get("x-reprise-cache")) == (200, "miss"), h
        time.sleep(0.5)

    total = gw.admin("/admin/stats")["requests"]["total"]
    deadline = time.time() + 30
    while True:
        got = prom.query(f'sum(reprise_requests_total{{job="{JOB}"}})', time.time())
        if got and float(got[0]["value"][1]) == total:
            break
        assert time.time() < deadline, f"Prometheus has {got}, the gateway counted {total}"
        time.sleep(0.2)
    # A few more scrapes and rule evaluations past the last change, so every rate window closes on it.
    time.sleep(4 * SCRAPE_S + 1)
    return start, time.time()
