"""The server's socket, bound before the model loads: a port out of range or already in use is a
one-line error at once, not after a minute of loading (uvicorn would bind only when it starts)."""
from __future__ import annotations

import argparse
import socket

from ..errors import ConfigError

MAX_PORT = 65535


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is 0 (any free one) to {MAX_PORT}, got {port}")
    return port


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (host a name or an IPv4/IPv6 address), or ConfigError
    naming --host or --port, whichever is at fault."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError(f"cannot resolve the address {host!r}: {getattr(err, 'strerror', None) or err}",
                          field="--host") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart does not wait out TIME_WAIT
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        field = "--host" if err.errno == 99 else "--port"  # EADDRNOTAVAIL: no interface has that address
        raise ConfigError(f"cannot listen on {where}: {err.strerror or err}", field=field) from None
    sock.set_inheritable(True)
    return sock
