"""A live `mnnllm serve` app on 127.0.0.1 for the tests: uvicorn in a thread, on a port the
OS picks, around a model loaded once per test module."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

import mnnllm_core
from mnnllm_core.serve.app import create_app
from paths import CONFIG

EXACT_CPU = {"memory": "normal", "thread_num": 2}
"""The cpu backend's fp32 path: its greedy tokens are reference.json's mnn_cpp_q4_memory_normal."""


def load_model(**config):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({**EXACT_CPU, **config})
    return llm.load()


class LiveServer:
    def __init__(self, llm, **app_options):
        self.app = create_app(llm, **app_options)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        host, port = self._socket.getsockname()
        self.url = f"http://{host}:{port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_config=None, timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def worker(self):
        return self.app.state.service.worker

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        self._socket.close()
