"""Task addresses: ``host:port`` parsing and the host names that mean "this machine"."""

import dataclasses
import ipaddress
import re

from tfdist.cluster.errors import ClusterError

# Matched with fullmatch: `$` alone would accept a trailing newline. Labels as in DNS, plus
# '_' (found in cluster node names, e.g. SLURM's, and resolved by getaddrinfo).
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                       r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*")
MAX_ADDRESS_CHARS = 300  # a 253-character host name, brackets, ':' and a port fit
_VISIBLE_ASCII = re.compile(r"[!-~]+")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclasses.dataclass(frozen=True)
class Address:
    """One task's address; ``port=None`` means "pick a free port at launch"."""

    host: str
    port: int | None = None

    def __str__(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port if self.port is not None else '<free port>'}"

    @property
    def is_local(self):
        """True for addresses of this machine (loopback names)."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host.lower() == "localhost"

    def key(self):
        """A value equal for two spellings of the same endpoint (localhost == 127.0.0.1)."""
        return ("loopback" if self.is_local else self.host.lower(), self.port)


def parse_address(text):
    """Parses ``host:port`` (``[v6]:port`` for IPv6).

    Raises:
        ClusterError: with the reason, when `text` is not a host and a port in 1-65535.
    """
    if len(text) > MAX_ADDRESS_CHARS:
        raise ClusterError(f'expected "host:port" of at most {MAX_ADDRESS_CHARS} characters; '
                           f"this one has {len(text):,}")
    text = text.strip()
    if not _VISIBLE_ASCII.fullmatch(text):
        raise ClusterError('expected "host:port" in visible ASCII characters, without spaces '
                           'or control characters')
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ClusterError('expected "host:port"')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        _check_ip(host, version=6)
    elif ":" in host:
        raise ClusterError('expected "host:port"; write IPv6 hosts in brackets, "[::1]:2222"')
    else:
        check_host(host)
    if not port.isdigit() or len(port) > 5:
        raise ClusterError(f"the port {port!r} is not a number in 1-65535")
    if not 1 <= int(port) <= 65535:
        raise ClusterError(f"the port {int(port)} is outside 1-65535")
    return Address(host, int(port))


def check_host(host):
    """Raises `ClusterError` unless `host` is a host name (DNS labels of letters, digits,
    '-' and '_', at most 253 characters) or an IPv4 address."""
    if not _HOSTNAME.fullmatch(host):
        shown = repr(host) if len(host) <= 253 else f"a {len(host):,}-character name"
        raise ClusterError(f"{shown} is not a valid host name or IP address")


def _check_ip(host, version):
    try:
        if ipaddress.ip_address(host).version == version:
            return
    except ValueError:
        pass
    raise ClusterError(f"{host!r} is not a valid IPv{version} address")
