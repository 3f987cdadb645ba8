"""Free local ports, and checks that a configured local port is really free."""

import contextlib
import socket


def free_ports(count, host="127.0.0.1"):
    """`count` distinct ports that nothing listens on right now.

    All sockets are held open until every port is chosen, so the ports differ; they are
    released before returning, so a task can bind them (a small race with other
    programs remains, as with any free-port picker).
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def port_in_use(port, host="127.0.0.1"):
    """True when binding `host:port` fails because something already holds it.

    SO_REUSEADDR (as gRPC sets it) keeps connections lingering in TIME_WAIT from a
    previous run from counting as "in use"; a live listener still does.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
