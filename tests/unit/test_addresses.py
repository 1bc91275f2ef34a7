"""A node on an IPv6 address: every URL built from its address must be one a client can use."""

import httpx

from workflows.addresses import http_base


def test_an_ipv6_address_is_bracketed_and_an_ipv4_one_or_a_name_is_not() -> None:
    assert http_base("fd00::11", 18000) == "http://[fd00::11]:18000"
    assert http_base("10.0.0.11", 18000) == "http://10.0.0.11:18000"
    assert http_base("n1.internal", 8005) == "http://n1.internal:8005"
    # What the gateway does with a route's endpoint: the host and port survive.
    url = httpx.URL(http_base("fd00::11", 18000) + "/v1/models")
    assert (url.host, url.port) == ("fd00::11", 18000)
