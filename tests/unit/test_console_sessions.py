"""The remote console's sessions and cookie rules, pure: the clock is passed in."""

from __future__ import annotations

import pytest

from gateway.admin.guard import check_same_site
from gateway.console.remote import cookie_is_secure
from gateway.console.sessions import SessionBook, csrf_matches
from gateway.errors import ApiError


def test_a_session_is_found_by_its_id_only() -> None:
    book = SessionBook()
    session_id, session = book.start("k1", now=0)
    assert book.find(session_id, now=1) is session
    assert book.find(session_id + "x", now=1) is None
    assert book.find("", now=1) is None
    assert book.find(None, now=1) is None
    other_id, other = book.start("k1", now=2)
    assert other_id != session_id
    assert other.csrf_token != session.csrf_token


def test_a_session_ends_after_its_idle_time_and_each_request_restarts_it() -> None:
    book = SessionBook(lifetime_s=100, idle_s=10)
    session_id, _ = book.start("k1", now=0)
    assert book.find(session_id, now=9) is not None
    assert book.find(session_id, now=18) is not None  # 9 s after the last request
    assert book.find(session_id, now=28.5) is None
    assert book.find(session_id, now=18) is None, "an expired session is forgotten"
    assert len(book) == 0


def test_a_session_ends_at_its_lifetime_however_busy() -> None:
    book = SessionBook(lifetime_s=30, idle_s=10)
    session_id, _ = book.start("k1", now=0)
    for now in (8, 16, 24):
        assert book.find(session_id, now=now) is not None
    assert book.find(session_id, now=30) is None


def test_logout_ends_the_session_and_the_book_is_bounded() -> None:
    book = SessionBook(limit=2)
    first, _ = book.start("k1", now=0)
    second, _ = book.start("k1", now=1)
    book.end(second)
    assert book.find(second, now=2) is None
    third, _ = book.start("k1", now=3)
    fourth, _ = book.start("k1", now=4)
    assert len(book) == 2
    assert book.find(first, now=5) is None, "the least recently used went first"
    assert book.find(third, now=5) is not None
    assert book.find(fourth, now=5) is not None


def test_the_csrf_token_must_be_the_sessions_own() -> None:
    book = SessionBook()
    _, session = book.start("k1", now=0)
    _, other = book.start("k1", now=0)
    assert csrf_matches(session, session.csrf_token)
    assert not csrf_matches(session, other.csrf_token)
    assert not csrf_matches(session, None)
    assert not csrf_matches(session, "")


@pytest.mark.parametrize(
    ("scheme", "host", "secure"),
    [
        ("https", "gw.example.com", True),
        ("https", "127.0.0.1:8000", True),
        ("http", "gw.example.com", True),  # plain http elsewhere: the browser will not keep it
        ("http", "10.0.0.5:8000", True),
        ("http", "127.0.0.1:8000", False),
        ("http", "localhost:8000", False),
        ("http", "[::1]:8000", False),
    ],
)
def test_the_cookie_is_secure_unless_plain_http_to_loopback(
    scheme: str, host: str, secure: bool
) -> None:
    assert cookie_is_secure(scheme, host) is secure


def test_the_remote_origin_check_takes_any_name_but_only_this_host() -> None:
    same = {"host": "gw.example.com", "origin": "https://gw.example.com"}
    check_same_site(same, any_host_name=True)
    with pytest.raises(ApiError):
        check_same_site(same)  # the admin API's rule: addresses and localhost only
    for origin in ("https://evil.example", "https://gw.example.com:8443", "null"):
        with pytest.raises(ApiError) as refused:
            check_same_site({"host": "gw.example.com", "origin": origin}, any_host_name=True)
        assert refused.value.status == 403
    with pytest.raises(ApiError):
        check_same_site({"host": "gw.example.com", "sec-fetch-site": "same-site"}, True)
