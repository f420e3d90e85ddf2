"""Where a local ``gpushare serve --host 0.0.0.0`` can be reached from a local cluster.

A kube-apiserver calls the webhook, not a pod, so what counts is what the apiserver's
node resolves and routes:

* minikube puts ``host.minikube.internal`` into its node's ``/etc/hosts`` (minikube v1.10+,
  docs "Host access": the address differs by driver), and the apiserver runs on the node's
  network, so ``https://host.minikube.internal:PORT`` reaches this machine;
* kind runs its nodes on the docker network ``kind`` (kind, pkg/cluster/internal/providers/
  docker/network.go); on Linux this machine's address on it is that network's gateway, an
  address of a ``br-<id>`` bridge here (``docker network inspect kind`` names it);
* Docker Desktop (macOS, Windows) resolves ``host.docker.internal`` to this machine in its
  containers, kind's nodes included.

The local certificate names all of these, and this machine's other non-loopback
addresses, so whichever the cluster uses passes TLS verification.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MINIKUBE_HOST = "host.minikube.internal"
DOCKER_DESKTOP_HOST = "host.docker.internal"
LOCAL_CLUSTER_NAMES = (DOCKER_DESKTOP_HOST, MINIKUBE_HOST)
# Interfaces docker creates for user-defined networks such as kind's: br-<network id>.
DOCKER_BRIDGE_PREFIX = "br-"
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_IF_INET6 = Path("/proc/net/if_inet6")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9-]+)*$")


@dataclass(frozen=True)
class HostAddress:
    address: IPAddress
    interface: str | None = None

    @property
    def on_docker_bridge(self) -> bool:
        return bool(self.interface and self.interface.startswith(DOCKER_BRIDGE_PREFIX))


def host_addresses() -> list[HostAddress]:
    """This machine's addresses that another machine or container could use: not loopback,
    link-local, multicast or unspecified; each once, in interface order."""
    found = [*_interface_ipv4(), *_interface_ipv6(), *_resolver_addresses()]
    seen: set[IPAddress] = set()
    usable = []
    for item in found:
        address = item.address
        if address in seen or _unusable(address):
            continue
        seen.add(address)
        usable.append(item)
    return usable


def _unusable(address: IPAddress) -> bool:
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
    )


def _interface_ipv4() -> list[HostAddress]:
    """Each interface's IPv4 address (Linux; elsewhere the resolver's answer has to do)."""
    if not sys.platform.startswith("linux"):
        return []
    import fcntl  # Unix only

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            found.append(HostAddress(ipaddress.IPv4Address(answer[20:24]), name))
    return found


def _interface_ipv6() -> list[HostAddress]:
    """Global IPv6 addresses from /proc/net/if_inet6 (Linux): address, index, prefix, scope
    (00 global), flags, interface."""
    try:
        lines = _IF_INET6.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[3] == "00":
            found.append(HostAddress(ipaddress.IPv6Address(bytes.fromhex(fields[0])), fields[5]))
    return found


def _resolver_addresses() -> list[HostAddress]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    found = []
    for info in infos:
        try:
            found.append(HostAddress(ipaddress.ip_address(str(info[4][0]).split("%")[0])))
        except ValueError:
            continue
    return found


def host_name() -> str | None:
    """This machine's name, where it is one a certificate can carry."""
    name = socket.gethostname()
    return name if _HOSTNAME.match(name) and name != "localhost" else None
