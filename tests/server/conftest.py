"""Fixtures of the live API tests: a server process on a free loopback port, stopped with SIGTERM.

--server-cmd is the command without --port (shell words); --fake-engine marks the engine's test
double (its outputs do not depend on the sampling temperature's randomness in the same way).
"""
import os
import re
import shlex
import signal
import socket
import subprocess
import time

import httpx
import pytest


def pytest_addoption(parser):
    parser.addoption("--server-cmd", required=True, help="server command line, without --port")
    parser.addoption("--fake-engine", action="store_true", help="the server runs the test double")
    parser.addoption("--stop-logged-pid", action="store_true",
                     help="stop the process whose pid the server logs (rank 0 under mpirun), not the "
                          "command's own process")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "constrained: a constrained-decoding test (JSON mode, structured outputs, forced tool "
                   "calls); the constraint stays with rank 0, so a multi-process server adds nothing to it")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, url, proc, fake):
        self.url = url
        self.proc = proc
        self.fake = fake

    def metrics(self):
        """The /metrics samples as {name{labels}: value}."""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def metric(self, name, **labels):
        """Sum of a metric's samples whose labels include `labels`."""
        total, found = 0.0, False
        for key, value in self.metrics().items():
            base = key.split("{", 1)[0]
            if base != name:
                continue
            if all(f'{k}="{v}"' in key for k, v in labels.items()):
                total += value
                found = True
        assert found, f"{name} {labels} is not on /metrics"
        return total


@pytest.fixture(scope="session")
def server(request, tmp_path_factory):
    port = free_port()
    cmd = shlex.split(request.config.getoption("--server-cmd")) + ["--port", str(port)]
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the server did not come up:\n{log_path.read_text()}")
        time.sleep(0.2)
    yield Server(url, proc, request.config.getoption("--fake-engine"))
    if request.config.getoption("--stop-logged-pid"):
        # mpirun would end the job on a signal of its own; rank 0 stops the others itself.
        m = re.search(r"\(max_model_len \d+; pid (\d+) ", log_path.read_text())
        assert m, f"the server logged no pid:\n{log_path.read_text()}"
        os.kill(int(m.group(1)), signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError(f"the server did not stop on SIGTERM:\n{log_path.read_text()}")
    log.close()
    text = log_path.read_text()
    print(text[-4000:])
    assert rc == 0, f"the server exited with {rc}:\n{text}"
    assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text, text
