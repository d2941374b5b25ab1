"""Starts a real `tensorfold serve` for the tests: the binary named by
TENSORFOLD_BIN, the model named by TENSORFOLD_TEST_MODEL (default SmolLM2)."""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model, *extra):
    binary = os.environ.get("TENSORFOLD_BIN", str(ROOT / "target" / "debug" / "tensorfold"))
    port = free_port()
    proc = subprocess.Popen(
        [binary, "serve", str(model), "--port", str(port), "--name", "test-model", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode())
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def serving(model):
    """Yields the base URL of a server for `model`, stopping it afterwards."""
    proc, base = start(model)
    yield base
    proc.terminate()
    proc.wait(timeout=10)


def openai_client(base, timeout):
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=timeout)


@pytest.fixture(scope="session")
def server():
    model = Path(os.environ.get("TENSORFOLD_TEST_MODEL", ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf"))
    if not model.exists():
        pytest.fail(f"{model} is missing: run `cargo xtask models`")
    yield from serving(model)


@pytest.fixture()
def client(server):
    return openai_client(server, 120)


@pytest.fixture(scope="session")
def qwen_server():
    """Qwen2.5-Coder 0.5B, whose template speaks tools (`cargo xtask test` fetches it)."""
    model = ROOT / "models" / "qwen2.5-coder-0.5b-instruct.gguf"
    if not model.exists():
        if os.environ.get("TENSORFOLD_REQUIRE_MODELS"):
            pytest.fail(f"{model} is missing")
        pytest.skip("Qwen2.5-Coder 0.5B not fetched")
    yield from serving(model)


@pytest.fixture()
def qwen(qwen_server):
    return openai_client(qwen_server, 300)


def anthropic_client(base, timeout):
    from anthropic import Anthropic

    return Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=timeout)


@pytest.fixture()
def claude(server):
    """The official anthropic client against the server's Messages API."""
    return anthropic_client(server, 120)


@pytest.fixture()
def qwen_claude(qwen_server):
    return anthropic_client(qwen_server, 300)
