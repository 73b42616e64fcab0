"""Where an open run listens on TCP (``--open-tcp``, a pmc extension): the socket bound
to the address, host name or interface asked for (every interface by default), on the
first free port of those asked for, and the hosts a client on another host tries, in
order (written beside the DAG by ``pmc.runtime.channel``).

Every interface: the run's host name first, then the addresses of its interfaces that
are up and not loopback. An interface (``ib0``): its IPv4 address, else its global IPv6
one. A host name or an address: that, as given.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import socket
import struct

from pmc.errors import FatalError
from pmc.optiontypes import Listen

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
_PORT_TAKEN = (errno.EADDRINUSE, errno.EACCES)


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None  # no IPv4 address (or down)
    return socket.inet_ntoa(raw[20:24])


def _ipv6_of(name: str) -> list[str]:
    """The global IPv6 addresses of an interface (/proc/net/if_inet6: scope 00)."""
    out = []
    with contextlib.suppress(OSError), open("/proc/net/if_inet6", encoding="ascii") as f:
        for line in f:
            words = line.split()
            if len(words) == 6 and words[5] == name and words[3] == "00":
                hexa = words[0]
                out.append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexa)))
    return out


def interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def _interface_address(name: str) -> str | None:
    v4 = _ipv4_of(name)
    if v4 is not None:
        return v4
    v6 = _ipv6_of(name)
    return v6[0] if v6 else None


def _every_host() -> list[str]:
    """What a client elsewhere may try for a socket bound to every interface."""
    hosts = [socket.gethostname()]
    for name in interfaces():
        if name == "lo":
            continue
        for addr in [*filter(None, [_ipv4_of(name)]), *_ipv6_of(name)]:
            if not addr.startswith("127.") and addr not in hosts:
                hosts.append(addr)
    return hosts


def _bind_address(spec: Listen) -> tuple[socket.AddressFamily, str, list[str]]:
    """The family and address to bind, and the hosts to write for clients."""
    if not spec.host:
        if socket.has_dualstack_ipv6():
            return socket.AF_INET6, "::", _every_host()
        return socket.AF_INET, "0.0.0.0", _every_host()  # noqa: S104 - asked for
    host = spec.host
    if host in interfaces():
        addr = _interface_address(host)
        if addr is None:
            raise FatalError(f"Open run: cannot listen on TCP {spec}: interface {host} "
                             "has no address")
        host = addr
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise FatalError(f"Open run: cannot listen on TCP {spec}: {host}: {e.strerror}"
                         ) from None
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0]), [host]


def listen(spec: Listen, backlog: int) -> tuple[socket.socket, list[str], int]:
    """A listening TCP socket for ``spec``, the hosts to write for clients and its
    port. Raises FatalError when it cannot be had."""
    family, addr, hosts = _bind_address(spec)
    ports = range(spec.first, spec.last + 1)
    last_error: OSError | None = None
    for port in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6 and addr == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr, port))
            sock.listen(backlog)
        except OSError as e:
            sock.close()
            last_error = e
            if e.errno in _PORT_TAKEN and port != ports[-1]:
                continue
            break
        return sock, hosts, int(sock.getsockname()[1])
    assert last_error is not None
    raise FatalError(f"Open run: cannot listen on TCP {spec}: "
                     f"{last_error.strerror or last_error}")
