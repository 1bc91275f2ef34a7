"""Media URLs that would make an engine fetch from inside: refused, and the rest pinned to the
address the gateway checked.

An engine that fetches media by URL (vLLM's and SGLang's multimodal models do) fetches it from
its own host, for the client: `http://127.0.0.1:8001/admin/v1/keys`, the agent's ports, a cloud
metadata address. So every http(s) media URL of a chat body is resolved here, once, off the
event loop (loop.getaddrinfo, within `RESOLVE_TIMEOUT_S`), and refused with a 400 naming the
field when any address it resolves to is not a public one: loopback, link-local (169.254.0.0/16,
metadata included), private, unique-local (fd00:ec2::254 included), shared, unspecified,
multicast or reserved, IPv4 inside IPv6 judged as IPv4. An operator's allowlist
(`media_url_allow`: CIDRs, and host names taken as they are) lets private sources through.

The engine must then fetch what was checked, not what a name resolves to a moment later (DNS
rebinding). An http URL naming a host is sent with the checked address in place of the name. An
https URL keeps its name: an address would fail the engine's certificate check, and a name
rebound to an inside address fails it too unless the inside server holds a certificate for the
client's name. docs/gateway.md says what is left (redirects the engine follows, engines that do
not verify certificates).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from gateway.errors import bad_request
from gateway.request_body import ProxiedRequest

# A resolver that does not answer in this long fails the request, not the gateway.
RESOLVE_TIMEOUT_S = 2.0
# Distinct hosts one request may name: each costs a lookup on the gateway's resolver threads.
MAX_MEDIA_HOSTS = 16

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from beyond public addresses: networks, and host names trusted as
    they are (not resolved, not rewritten)."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()
    timeout_s: float = RESOLVE_TIMEOUT_S

    @classmethod
    def of(cls, allow: Iterable[str]) -> MediaPolicy:
        """From the `media_url_allow` setting: each entry a CIDR, an address or a host name."""
        networks: list[Network] = []
        hosts: set[str] = set()
        for entry in allow:
            entry = entry.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def allows(self, address: Address) -> bool:
        if any(address in network for network in self.networks):
            return True
        return not _inside(address)


def _inside(address: Address) -> bool:
    """Whether `address` is anything but a public unicast address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return _inside(embedded)
        if address.teredo is not None:
            return any(_inside(part) for part in address.teredo)
    return not address.is_global or address.is_multicast


class _Refused(Exception):
    def __init__(self, url: str, why: str) -> None:
        super().__init__(why)
        self.url = url
        self.why = why


async def pinned_urls(request: ProxiedRequest, policy: MediaPolicy) -> dict[str, str]:
    """Check every media URL of `request` (ProxiedRequest.media_urls) against `policy`; return
    each http URL that names a host with the checked address in its place (for
    gateway/body_parse.py's `with_urls_pinned`), a 400 naming the field for one refused."""
    if not request.media_urls:
        return {}
    where = {url: field for field, url in reversed(request.media_urls)}
    parsed = {url: _parse(url, field) for url, field in where.items()}
    hosts = sorted(
        {
            (p.hostname, _port(p))
            for p in parsed.values()
            if p.hostname and _needs_lookup(p.hostname, policy)
        }
    )
    if len(hosts) > MAX_MEDIA_HOSTS:
        raise bad_request(
            f"The media URLs name {len(hosts)} hosts; at most {MAX_MEDIA_HOSTS} are accepted.",
            param=request.media_urls[0][0],
            code="too_many_media_hosts",
        )
    loop = asyncio.get_running_loop()
    answers = await asyncio.gather(
        *(_resolve(loop, host, port, policy.timeout_s) for host, port in hosts),
        return_exceptions=True,
    )
    resolved: dict[tuple[str, int], list[Address]] = {}
    for (host, port), answer in zip(hosts, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, OSError | TimeoutError):
                raise answer
            field = next(where[u] for u, p in parsed.items() if p.hostname == host)
            why = (
                "did not resolve in time" if isinstance(answer, TimeoutError) else "did not resolve"
            )
            raise bad_request(
                f"'{field}': the host '{host}' of its URL {why}.",
                param=field,
                code="unresolvable_url",
            )
        resolved[(host, port)] = answer
    pinned: dict[str, str] = {}
    for url, split in parsed.items():
        name = split.hostname
        assert name is not None  # _parse refuses a URL without one
        literal = _literal(name)
        if literal is None and not _needs_lookup(name, policy):
            continue  # a host name on the allowlist: trusted as it is
        addresses = [literal] if literal is not None else resolved[(name, _port(split))]
        refused = next((a for a in addresses if not policy.allows(a)), None)
        if refused is not None:
            raise bad_request(
                f"'{where[url]}' points inside ({name} is {refused}, not a public address); "
                "the gateway does not let an engine fetch from there.",
                param=where[url],
                code="media_url_not_allowed",
            )
        if literal is None and split.scheme == "http":
            pinned[url] = _with_host(split, addresses[0])
    return pinned


def _parse(url: str, field: str) -> SplitResult:
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        split = None
    if split is None or not split.hostname:
        raise bad_request(f"'{field}' is not a valid URL.", param=field, code="invalid_url")
    return split


def _port(split: SplitResult) -> int:
    return split.port or (443 if split.scheme == "https" else 80)


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _needs_lookup(host: str, policy: MediaPolicy) -> bool:
    return _literal(host) is None and host.rstrip(".") not in policy.hosts


async def _resolve(
    loop: asyncio.AbstractEventLoop, host: str, port: int, timeout_s: float
) -> list[Address]:
    async with asyncio.timeout(timeout_s):
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise OSError(f"no address for {host}")
    return addresses


def _with_host(split: SplitResult, address: Address) -> str:
    host = f"[{address}]" if address.version == 6 else str(address)
    userinfo = split.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + host
    if split.port is not None:
        netloc += f":{split.port}"
    return split._replace(netloc=netloc).geturl()
