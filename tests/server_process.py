"""Starts `python -m server` as a real process on a free loopback port and stops it with SIGINT,
as Ctrl-C would."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import scripted_model
from conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, env: dict | None = None, timeout_s: float = 60.0):
    port = free_port()
    python_path = os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen([sys.executable, "-m", "server", "--port", str(port), *args], cwd=ROOT,
                               env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{process.stdout.read()}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become healthy")
            time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def served_with_client(*args: str, timeout: float = 60.0):
    """running_server(*args) and an OpenAI SDK client of its /v1 (no retries: a test sees each
    request's own outcome): (base, client)."""
    with running_server(*args) as (base, _):
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=timeout)


@contextlib.contextmanager
def scripted_server(directory):
    """The scripted model (scripted_model.py) written under `directory` and served:
    (base, client, model_dir)."""
    model_dir = scripted_model.write(directory / "glm-scripted")
    with served_with_client("--model", str(model_dir)) as (base, client):
        yield base, client, model_dir
