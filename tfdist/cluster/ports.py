"""Free local ports, and checks that a configured local port is really free.

TensorFlow's gRPC server listens on every local address (``[::]`` or ``0.0.0.0``), so a
port is only free when no socket listens on it at *any* local address: 127.0.0.1,
``[::1]``, another loopback address or a network interface. Binding the wildcard
addresses is the one probe that sees all of them.
"""

import contextlib
import errno
import socket

from tfdist.cluster.errors import ClusterError


def free_ports(count):
    """`count` distinct ports that nothing listens on right now, at any local address.

    All sockets are held open until every port is chosen, so the ports differ; they are
    released before returning, so a task can bind them (a small race with other
    programs remains, as with any free-port picker).

    Raises:
        ClusterError: the ports cannot be held at once (e.g. the open-files limit).
    """
    try:
        return _free_ports(count)
    except OSError as e:
        raise ClusterError(f"cannot pick {count} free local ports ({e.strerror or e}); "
                           "fewer tasks, or a higher open-files limit (ulimit -n)") from None


def _free_ports(count):
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(100 * count):
            if len(ports) == count:
                break
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # see port_in_use
            sock.bind(("0.0.0.0", 0))
            port = sock.getsockname()[1]
            if not port_in_use(port):  # free on IPv4 may still be taken on [::1]
                ports.append(port)
        if len(ports) < count:
            raise OSError(errno.EADDRINUSE, f"only {len(ports)} of them are free")
        return ports


def port_in_use(port):
    """True when something listens on `port` at any local address (IPv4 or IPv6).

    SO_REUSEADDR (as gRPC sets it) keeps connections lingering in TIME_WAIT from a
    previous run from counting as "in use"; a live listener still does.
    """
    for family, host in _WILDCARDS:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    return True  # a listener, or a port this user may not bind
                # e.g. EADDRNOTAVAIL: this address family is switched off here
    return False


_WILDCARDS = ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::"))
