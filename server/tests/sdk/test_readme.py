"""The README's runnable snippets, run as written against a real gateway in front of reprise-sim.

A fenced block right after `<!-- readme-test: KIND -->` is run: `python` with this venv's
interpreter (the SDKs the README names are installed in it), `sh` with bash, `config` read by
`reprise check-config --config`. The only change made is the gateway's address: the README's
127.0.0.1:8080 becomes the test gateway's ephemeral port. No API key is set, as on a first try.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import BIN_DIR  # noqa: E402  (after the path it needs)

README = Path(__file__).resolve().parents[3] / "README.md"
MARKED = re.compile(r"<!-- readme-test: (\w+) -->\n```\w*\n(.*?)\n```", re.S)


def snippets(kind):
    return [m.group(2) for m in MARKED.finditer(README.read_text()) if m.group(1) == kind]


def first_try_env():
    """The environment of someone who has not set any provider key yet."""
    env = dict(os.environ)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL"):
        env.pop(key, None)
    return env


def here(code, gateway_url):
    address = gateway_url.removeprefix("http://").removesuffix("/v1")
    return code.replace("127.0.0.1:8080", address).replace("localhost:8080", address)


def test_the_readme_marks_its_runnable_snippets():
    counts = {kind: len(snippets(kind)) for kind in ("python", "sh", "config")}
    assert all(n >= 1 for n in counts.values()), counts
    kinds = {m.group(1) for m in MARKED.finditer(README.read_text())}
    assert kinds <= {"python", "sh", "config"}, f"a marker this test does not run: {kinds}"


@pytest.mark.parametrize("index", range(len(snippets("python"))))
def test_python_snippets_run_as_written_without_an_api_key(gateway_url, index):
    code = here(snippets("python")[index], gateway_url)
    run = subprocess.run([sys.executable, "-c", code], env=first_try_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{code}\n---\n{run.stderr}"
    assert run.stdout.strip(), f"{code}\nprinted nothing"


@pytest.mark.parametrize("index", range(len(snippets("sh"))))
def test_shell_snippets_run_as_written_without_an_api_key(gateway_url, index):
    code = here(snippets("sh")[index], gateway_url)
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=first_try_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{code}\n---\n{run.stderr}"
    assert run.stdout.strip() and '"error"' not in run.stdout, f"{code}\n---\n{run.stdout}"


@pytest.mark.parametrize("index", range(len(snippets("config"))))
def test_config_snippets_are_files_the_gateway_accepts(tmp_path, index):
    path = tmp_path / "reprise.toml"
    path.write_text(snippets("config")[index] + "\n")
    run = subprocess.run([str(BIN_DIR / "reprise"), "check-config", "--config", str(path)],
                         env={k: v for k, v in os.environ.items() if not k.startswith("REPRISE_")},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_the_example_config_reads_back_as_check_config_prints_it(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPRISE_")}
    example = subprocess.run([str(BIN_DIR / "reprise"), "config", "example"], env=clean,
                             capture_output=True, text=True, timeout=60, check=True).stdout
    path = tmp_path / "reprise.toml"
    path.write_text(example)
    checked = subprocess.run([str(BIN_DIR / "reprise"), "check-config", "--config", str(path)],
                             env=clean, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    # The same keys and values, under its own opening comment.
    assert checked.stdout.split("\n\n", 1)[1] == example.split("\n\n", 1)[1]
