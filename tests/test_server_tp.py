"""The server at tensor parallelism 2 as two processes on loopback: rank 0 serves HTTP, rank 1 is a
worker. A streamed chat works; when rank 1 dies, /health turns 503 and requests fail with a clear
error instead of hanging."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
from conftest import ROOT
from glm_fixtures import checkpoint_dir
from server_process import free_port, running_server


def test_tp2_server_and_a_dead_worker():
    run_tp2_server_and_kill_the_worker("cpu")


def run_tp2_server_and_kill_the_worker(backend: str) -> None:
    """Rank 0 serves HTTP with `backend`, rank 1 is a worker process (on its own GPU with cuda)."""
    model = str(checkpoint_dir("3.0"))
    master = f"127.0.0.1:{free_port()}"
    worker_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))}
    worker = subprocess.Popen([sys.executable, "-m", "server", "--model", model, "--tp-world", "2", "--tp-rank", "1",
                               "--tp-master", master], cwd=ROOT, env=worker_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with running_server("--model", model, "--model-name", "glm-tiny", "--backend", backend, "--tp-world", "2", "--tp-master", master) as (base, _):
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)
            chunks = list(client.chat.completions.create(model="glm-tiny", messages=[{"role": "user", "content": "Hi"}],
                                                         max_tokens=8, temperature=0, stream=True))
            assert chunks[-1].choices[0].finish_reason == "length"
            worker.kill()
            worker.wait()
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model="glm-tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
            assert caught.value.status_code == 503 and "tensor-parallel peer" in caught.value.message
            for _ in range(50):
                if httpx.get(f"{base}/health").status_code == 503:
                    break
                time.sleep(0.1)
            health = httpx.get(f"{base}/health")
            assert health.status_code == 503 and "tensor-parallel peer" in health.json()["error"]["message"]
    finally:
        if worker.poll() is None:
            worker.kill()
