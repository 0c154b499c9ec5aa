"""The README's Python snippets run as written: the Python API block as it stands, the OpenAI
client block against a server on the default model (its address swapped for the test server's)."""
from __future__ import annotations

import re
import subprocess
import sys

import httpx
from conftest import ROOT
from server_process import running_server

BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{code}\n---\n{done.stderr}"
    return done.stdout


def test_the_python_api_snippet_runs():
    (snippet,) = [block for block in BLOCKS if "trellisforge.Engine" in block]
    assert run(snippet).strip()


def test_the_client_snippet_runs():
    (snippet,) = [block for block in BLOCKS if "from openai import OpenAI" in block]
    assert 'model="default"' in snippet and "http://127.0.0.1:8000/v1" in snippet
    with running_server() as (base, _):
        # The reply is drawn (temperature 1): its text may be empty (EOS first, or all 16 tokens
        # inside <think>), so the proof is the printed line and the tokens the server counted.
        assert run(snippet.replace("http://127.0.0.1:8000", base)).endswith("\n")
        metrics = httpx.get(f"{base}/metrics").text
        assert re.search(r"^trellisforge_requests_total\{outcome=\"completed\"\} 1\.0$", metrics, re.MULTILINE), metrics
        generated = re.search(r"^trellisforge_generation_tokens_total ([0-9.]+)$", metrics, re.MULTILINE)
        assert generated and 1 <= float(generated.group(1)) <= 16
