"""The remote console's logins: server-side sessions kept in this gateway's memory.

A session is a random 32-byte id the browser holds in a cookie, and a CSRF token of its own the
page sends back in a header with every change. Only the id's sha256 is the table's key, so a
lookup compares digests, never the id itself byte by byte against stored ids.

A session ends at the first of: logout, `idle_s` without a request, `lifetime_s` after login,
the admin key behind it no longer being an active admin key (checked by the caller on every
request), or the gateway restarting (nothing is written anywhere: each gateway process has its
own sessions, so behind a load balancer a browser must stick to one process).

Pure: the clock is passed in, so expiry is tested without waiting.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

SESSION_ID_BYTES = 32
CSRF_TOKEN_BYTES = 32
# Eight hours from login, half an hour without a request: an operator's working day, and a
# console left open on an unattended machine logs itself out.
LIFETIME_S = 8 * 3600.0
IDLE_S = 30 * 60.0
# Logins this gateway remembers at once; past it the least recently used session ends. Each
# login needs an admin key, so this bounds memory, not guessing.
MAX_SESSIONS = 1000


@dataclass
class Session:
    key_id: str
    csrf_token: str
    started: float
    last_seen: float


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class SessionBook:
    def __init__(
        self, lifetime_s: float = LIFETIME_S, idle_s: float = IDLE_S, limit: int = MAX_SESSIONS
    ) -> None:
        if lifetime_s <= 0 or idle_s <= 0 or limit < 1:
            raise ValueError("lifetime_s, idle_s and limit must be positive")
        self._lifetime_s = lifetime_s
        self._idle_s = idle_s
        self._limit = limit
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, key_id: str, now: float) -> tuple[str, Session]:
        """A new session for an admin key that just logged in: its id (for the cookie, the only
        copy) and the session."""
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        session = Session(key_id, secrets.token_urlsafe(CSRF_TOKEN_BYTES), now, now)
        if len(self._sessions) >= self._limit:
            self._sessions.popitem(last=False)
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def find(self, session_id: str | None, now: float) -> Session | None:
        """The live session behind a cookie's id, its idle clock restarted; None (and the
        session forgotten) when there is none or it has expired."""
        if not session_id:
            return None
        digest = _digest(session_id)
        session = self._sessions.get(digest)
        if session is None:
            return None
        if now - session.started >= self._lifetime_s or now - session.last_seen >= self._idle_s:
            del self._sessions[digest]
            return None
        session.last_seen = now
        self._sessions.move_to_end(digest)
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_digest(session_id), None)


def csrf_matches(session: Session, presented: str | None) -> bool:
    """Whether a request carries the session's CSRF token, compared in constant time."""
    if not presented:
        return False
    return hmac.compare_digest(presented.encode(), session.csrf_token.encode())
