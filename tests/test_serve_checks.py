"""`mnnllm serve` checks its address before it loads the model: one line, exit 2, at once."""
import socket
import subprocess
import sys
import time

import pytest

from paths import MODEL_DIR


def serve(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "serve", str(MODEL_DIR), *args],
                          capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - start


@pytest.mark.parametrize("args,expected", [
    (["--port", "99999"], "error: mnnllm serve: argument --port: a port is 0 (any free one) to 65535, got 99999"),
    (["--port", "http"], "error: mnnllm serve: argument --port: expected a port number, got 'http'"),
    (["--host", "no-such-host.invalid"], "error: cannot resolve the address 'no-such-host.invalid'"),
])
def test_a_bad_address_is_one_line_before_loading(args, expected):
    done, seconds = serve(*args)
    assert done.returncode == 2 and done.stderr.startswith(expected) and done.stderr.count("\n") == 1, done.stderr
    assert "loading" not in done.stderr and seconds < 15


def test_a_port_in_use_is_one_line_before_loading():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done, seconds = serve("--port", str(port))
    assert done.returncode == 2 and seconds < 15
    assert done.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use (field --port)\n"
