"""Who may use the admin API, decided from the socket's peer and a request's headers alone.

The admin API has no login: reaching it is meant to mean holding the gateway's machine, so it
answers loopback clients only. That alone lets in every page open in the operator's browser,
which is why the seed added three more checks, kept here in one place:

- Host must be an address or `localhost`. A page that rebinds its own name to 127.0.0.1 (DNS
  rebinding) reaches the socket from loopback, but its requests still carry that name as Host.
- Nothing a browser marks as cross-site: `Sec-Fetch-Site` other than `same-origin` or `none`
  (a user typing the URL), or an `Origin` that is not this very origin on an address or
  localhost (`null`, sent by sandboxed frames and `file:` pages, included). Clients that are not
  browsers send neither header, so curl and scripts are unaffected.
- A change (POST, PUT, PATCH, DELETE) comes as `application/json`, body or not. A page can send
  text/plain or a form to any origin without asking first (a "simple" request, the classic
  CSRF); application/json needs a CORS preflight, which this API never grants.

Every function here takes plain values and raises `ApiError`, so the rules are tested without a
server and the routers only adapt a Request to them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from gateway.errors import ApiError

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# What a browser sends for a request from the admin origin itself, or one the user started
# (typing the URL, a bookmark). "same-site" is refused: another port on localhost is the same
# site, and a different origin.
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def _refused(why: str, code: str) -> ApiError:
    return ApiError(403, f"Refused: {why}.", type_="permission_error", code=code)


def is_loopback_client(client_host: str | None) -> bool:
    """The socket's peer is this machine: 127.0.0.0/8, ::1, or 127.x mapped into IPv6 (what a
    dual-stack listener reports)."""
    if not client_host:
        return False
    try:
        address = ipaddress.ip_address(client_host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """`host[:port]` as a Host header or an origin's netloc carries it, the name lowercased
    and IPv6 brackets removed; None when it is not well formed (userinfo, a bad port, two
    colons outside brackets)."""
    authority = authority.strip()
    if not authority or "@" in authority:
        return None
    if authority.startswith("["):
        name, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif authority.count(":") > 1:
        return None
    else:
        name, colon, port_text_or_empty = authority.partition(":")
        port_text = port_text_or_empty if colon else None
    if port_text is None:
        return name.lower(), None
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        return None
    return name.lower(), int(port_text)


def is_address_or_localhost(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_is_local_name(host_header: str) -> bool:
    """Host names this machine by address or as localhost: never a name someone else's DNS
    decides."""
    authority = split_authority(host_header)
    return authority is not None and is_address_or_localhost(authority[0])


def check_local(client_host: str | None, host_header: str) -> None:
    if not is_loopback_client(client_host) or not host_is_local_name(host_header):
        raise ApiError(
            403,
            "The admin API answers only to local clients.",
            type_="permission_error",
            code="admin_local_only",
        )


def origin_is_host(origin: str, host_header: str) -> bool:
    """Whether a browser's Origin names the host and port the request was sent to (Host): http
    or https (a TLS proxy in front may have turned https into http), the port a scheme implies
    counting as given. Any name; see origin_matches_host for the admin API's narrower rule."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in DEFAULT_PORTS or parts.path or parts.query or parts.fragment:
        return False
    origin_authority = split_authority(parts.netloc)
    host_authority = split_authority(host_header)
    if origin_authority is None or host_authority is None:
        return False
    name, port = origin_authority
    host_name, host_port = host_authority
    default = DEFAULT_PORTS[parts.scheme]
    return name == host_name and (port or default) == (host_port or default)


def origin_matches_host(origin: str, host_header: str) -> bool:
    """Whether a browser's Origin is the admin API's own origin: http(s), on an address or
    localhost, with the same host and port as Host (the port a scheme implies counts as given).
    A page on another localhost port is another origin, and refused."""
    authority = split_authority(urlsplit(origin.strip()).netloc)
    return (
        authority is not None
        and is_address_or_localhost(authority[0])
        and origin_is_host(origin, host_header)
    )


def check_same_site(headers: Mapping[str, str], any_host_name: bool = False) -> None:
    """`headers` looked up by lowercase name (Starlette's Headers are). `any_host_name`: the
    Origin may be any name as long as it is the request's own host (the remote console, on the
    public listener); otherwise it must also be an address or localhost (the admin API)."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.strip().lower() not in ALLOWED_FETCH_SITES:
        raise _refused("a browser marked this request cross-site", "admin_cross_site")
    origin = headers.get("origin")
    matches = origin_is_host if any_host_name else origin_matches_host
    if origin is not None and not matches(origin, headers.get("host", "")):
        raise _refused("the request comes from another origin", "admin_cross_site")


def check_json_body(headers: Mapping[str, str]) -> None:
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415, "Changes are accepted as application/json only.", code="unsupported_media_type"
        )


def check_admin_request(method: str, client_host: str | None, headers: Mapping[str, str]) -> None:
    """Every rule, in the order that explains a refusal best: who is asking, whether a browser
    page is behind it, then whether a change is shaped as one no page can send."""
    check_local(client_host, headers.get("host", ""))
    check_same_site(headers)
    if method.upper() in WRITE_METHODS:
        check_json_body(headers)
