"""`mnnllm serve`: the app on uvicorn, with the load and every request logged."""
from __future__ import annotations

import ipaddress
import logging
import socket

from ..errors import MnnllmError
from ..llm.llm import Llm

log = logging.getLogger(__name__)


def prepare() -> None:
    """Before the (long) load: check the `serve` extra is installed, and turn on INFO logs
    from mnnllm (the load, each request) and uvicorn, since a server tells what it does."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise MnnllmError(f"mnnllm serve needs the serve extra: pip install 'mnnllm[serve]' ({err})") from None
    for name in ("mnnllm", "mnnllm_core", "uvicorn"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(llm: Llm, sock: socket.socket, *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
        queue_size: int = 8, default_max_tokens: int | None = None, parallel: int | str = "auto") -> int:
    """Serve a loaded model on `sock` (listen.bind(host, port), bound before the load) until
    interrupted (Ctrl-C). `parallel`: requests decoding together, or "auto" (slots.py)."""
    import uvicorn

    from .app import create_app
    from .slots import plan_slots

    if not is_loopback(host) and not api_key:
        log.warning("serving on %s without --api-key: anyone who can reach this address can use the model", host)
    slots = plan_slots(llm, parallel)
    app = create_app(llm, api_key=api_key, queue_size=queue_size, default_max_tokens=default_max_tokens,
                     parallel=slots.parallel)
    log.info("serving %s on backend %s (%s; queue size %d): the chat page at /, the API under /v1/",
             app.state.service.model_id, llm.runtime_manager.config.backend_type, slots.describe(), queue_size)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, timeout_graceful_shutdown=3)
    try:
        _server_on(uvicorn.Server, sock)(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: the server stopped as asked
        pass
    return 0


def _server_on(base: type, sock: socket.socket) -> type:
    """uvicorn's Server, saying where it listens once started, as it does when it binds the socket
    itself (scripts wait for that line)."""
    class Server(base):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                host, port = sock.getsockname()[:2]
                where = f"[{host}]" if ":" in host else host
                log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", where, port)
    return Server
