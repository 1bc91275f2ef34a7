"""Locking out clients that keep presenting bad API keys.

A key is 256 random bits, so guessing is hopeless; what this stops is a client hammering the
gateway with bad keys (each costs a hash and a log line) and noisy credential-stuffing scans.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import OrderedDict

# An IPv6 client is grouped by its /64: a single host is usually handed a whole /64 and can
# pick any of its 2**64 addresses, so counting per address would lock out nothing.
IPV6_HOST_PREFIX_BITS = 64

ClientGroup = str | int


class _Failures:
    __slots__ = ("count", "locked_until", "window_start")

    def __init__(self, now: float) -> None:
        self.window_start = now
        self.count = 0
        self.locked_until = 0.0


class FailedAuthLimiter:
    """After `max_failures` failed authentications within `window_s` of the first one, a client
    is refused for `lockout_s`. The window starts at a client's first failure rather than
    sliding, which keeps an entry at three numbers; it lets at most 2 * max_failures - 2
    failures through in any window_s, still a cap on the guessing rate.

    At most `max_clients` clients are remembered; past that the least recently seen is
    forgotten. The trade-off: an attacker spraying from more addresses than that can push a
    locked client out and let it retry early. A locked client that keeps knocking stays
    recent, so the sprayer needs max_clients fresh IPv4 addresses or IPv6 /64s between two of
    its attempts; an attacker with that many addresses is not slowed by per-address limits
    anyway, while an unbounded table would let it exhaust the gateway's memory."""

    def __init__(
        self,
        max_failures: int = 10,
        window_s: float = 60,
        lockout_s: float = 60,
        max_clients: int = 100_000,
    ) -> None:
        if max_failures < 1 or max_clients < 1 or window_s <= 0 or lockout_s <= 0:
            raise ValueError("max_failures, window_s, lockout_s and max_clients must be positive")
        self._max_failures = max_failures
        self._window_s = window_s
        self._lockout_s = lockout_s
        self._max_clients = max_clients
        self._clients: OrderedDict[ClientGroup, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def retry_after(self, client: str, now: float) -> float | None:
        """Seconds the client must wait before it may authenticate; None when it may now."""
        if not self._clients:
            return None  # the usual case: nobody is failing, so nothing to parse or look up
        group = client_group(client)
        entry = self._clients.get(group)
        if entry is None or entry.locked_until <= now:
            return None
        self._clients.move_to_end(group)
        return entry.locked_until - now

    def failed(self, client: str, now: float) -> float | None:
        """Counts a failed authentication; returns the lockout in seconds if it starts now."""
        group = client_group(client)
        entry = self._clients.get(group)
        if entry is None:
            if len(self._clients) >= self._max_clients:
                self._clients.popitem(last=False)
            entry = self._clients[group] = _Failures(now)
        else:
            self._clients.move_to_end(group)
        if entry.locked_until > now:
            return None  # already locked: the caller should not have let it try
        if now - entry.window_start >= self._window_s or entry.count == 0:
            entry.window_start = now
            entry.count = 0
        entry.count += 1
        if entry.count < self._max_failures:
            return None
        entry.locked_until = now + self._lockout_s
        entry.count = 0  # after the lockout the client starts afresh
        return self._lockout_s

    def lock(self, group: str, seconds: float, now: float) -> None:
        """Lock out a client group another gateway locked out (`group` as `stored_group`
        wrote it) for `seconds` from `now`; a longer lockout already here is kept."""
        key = _group_from_stored(group)
        entry = self._clients.get(key)
        if entry is None:
            if len(self._clients) >= self._max_clients:
                self._clients.popitem(last=False)
            entry = self._clients[key] = _Failures(now)
        entry.locked_until = max(entry.locked_until, now + seconds)

    def succeeded(self, client: str, now: float) -> None:
        """A success does not wipe the client's recent failures: a client holding one valid key
        could otherwise interleave it with guesses and never be locked. Someone who mistyped a
        key a few times is far from the limit and their failures expire with the window; this
        only forgets a client whose failures already have, to free its entry early."""
        if not self._clients:
            return
        group = client_group(client)
        entry = self._clients.get(group)
        if (
            entry is not None
            and entry.locked_until <= now
            and now - entry.window_start >= self._window_s
        ):
            del self._clients[group]


def client_group(address: str) -> ClientGroup:
    """The unit a lockout applies to: an IPv4 address as it is, an IPv6 address as the integer
    of its /64. Anything that does not parse (a Unix socket, a test client) stays a string."""
    if ":" not in address:
        return address  # IPv4, the common case, without the cost of parsing
    return _ipv6_group(address)


def stored_group(client: str) -> str:
    """The client's group as text, for the store: an IPv6 /64 as its integer in decimal, which
    no IPv4 address or other name (they hold dots or letters) can be mistaken for."""
    return str(client_group(client))


def _group_from_stored(text: str) -> ClientGroup:
    return int(text) if text.isdigit() else text


# Parsing an IPv6 address takes several microseconds; a busy gateway sees the same clients
# again and again. Bounded, so addresses sprayed by an attacker only cost their parse.
@functools.lru_cache(maxsize=16_384)
def _ipv6_group(address: str) -> ClientGroup:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        mapped = parsed.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return int(parsed) >> (128 - IPV6_HOST_PREFIX_BITS)
    return str(parsed)
