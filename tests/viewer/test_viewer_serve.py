"""`stare-agents show --serve` answers only requests addressed to the address it bound (issue 32): a web page
whose own name resolves to 127.0.0.1 (DNS rebinding) sends that name as Host and gets 403, not the rollouts."""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = "<html><body>rollouts</body></html>"


@pytest.fixture
def served(tmp_path: Path):
    page = tmp_path / "rollouts.html"
    page.write_text(PAGE)
    server = subprocess.Popen(
        [sys.executable, "-u", "-c", f"from stare_agents.viewer import serve; serve({str(page)!r}, port=0)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        yield int(match.group(1))
    finally:
        server.send_signal(signal.SIGINT)  # what Ctrl-C does
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def get(port: int, host: str | None) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("GET", "/", skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_serve_answers_its_own_address_only(served: int) -> None:
    port = served
    assert get(port, f"127.0.0.1:{port}") == (200, PAGE)
    assert get(port, f"localhost:{port}") == (200, PAGE)
    for host in (
        f"attacker.example:{port}",
        "attacker.example",
        f"127.0.0.1:{port + 1}",
        "127.0.0.1",
        "",
        None,
    ):
        status, body = get(port, host)
        assert status == 403 and "rollouts" not in body, (host, status)
