"""Media URLs that point inside are refused, the rest pinned to the address checked
(gateway/media_urls.py), through the body parser every proxied body goes through."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest

from gateway.body_parse import BodyParser, upstream_payload
from gateway.errors import ApiError
from gateway.media_urls import MAX_MEDIA_HOSTS, MediaPolicy
from gateway.request_body import CHAT, ProxiedRequest

PUBLIC = "93.184.216.34"


def chat(*parts: dict[str, Any]) -> bytes:
    content = [{"type": "text", "text": "what is this?"}, *parts]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    return json.dumps(body).encode()


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture
async def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names the event loop's resolver answers, with their addresses; any other name fails."""
    answers: dict[str, list[str]] = {}
    loop_class = type(asyncio.get_running_loop())

    async def getaddrinfo(_loop: object, host: str, port: int, **_: object) -> list[Any]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if answers[host] == ["hang"]:
            await asyncio.sleep(60)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in answers[host]
        ]

    monkeypatch.setattr(loop_class, "getaddrinfo", getaddrinfo)
    return answers


async def parse(raw: bytes, policy: MediaPolicy | None = None) -> ProxiedRequest:
    return await BodyParser(64 * 1024, 1, 1.0, policy).parse(CHAT, raw)


async def refused(raw: bytes, policy: MediaPolicy | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await parse(raw, policy)
    assert caught.value.status == 400
    return caught.value


def sent(request: ProxiedRequest, raw: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(upstream_payload(request, raw, changed=False))
    return payload


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8001/admin/v1/keys",  # the hostile client's own
        "http://127.0.0.2/",
        "http://[::1]:8001/admin/v1/keys",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://[fd00:ec2::254]/latest/meta-data/",  # EC2's over IPv6
        "http://10.0.0.5:18000/v1/models",
        "https://192.168.1.1/",
        "http://172.16.0.1/",
        "http://100.64.0.1/",  # shared address space
        "http://0.0.0.0:8001/",
        "http://224.0.0.1/",
        "http://240.0.0.1/",  # reserved
        "http://[::ffff:127.0.0.1]/",  # IPv4 inside IPv6
        "http://[fe80::1]/",
    ],
)
async def test_an_address_inside_is_refused_naming_the_field(url: str) -> None:
    error = await refused(chat(image(url)))
    assert error.code == "media_url_not_allowed"
    assert error.param == "messages[0].content[1].image_url"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_audio", "input_audio": {"url": "http://127.0.0.1/a.wav"}},
        {"type": "audio_url", "audio_url": {"url": "http://127.0.0.1/a.wav"}},
        {"type": "video_url", "video_url": "http://127.0.0.1/v.mp4"},
        {"type": "file", "file": {"file_url": "http://127.0.0.1/f.pdf"}},
    ],
)
async def test_audio_video_and_file_urls_are_checked_too(part: dict[str, Any]) -> None:
    kind = part["type"]
    error = await refused(chat(part))
    assert (error.code, error.param) == ("media_url_not_allowed", f"messages[0].content[1].{kind}")


async def test_a_name_that_resolves_inside_is_refused(dns: dict[str, list[str]]) -> None:
    dns["metadata.example"] = ["169.254.169.254"]
    # One inside address among public ones is enough: the engine may pick any of them.
    dns["mixed.example"] = [PUBLIC, "127.0.0.1"]
    for host in ("metadata.example", "mixed.example"):
        error = await refused(chat(image(f"https://{host}/x.png")))
        assert error.code == "media_url_not_allowed"
        assert error.param == "messages[0].content[1].image_url"


async def test_an_http_url_is_sent_with_the_address_checked_so_rebinding_cannot_switch_it(
    dns: dict[str, list[str]],
) -> None:
    dns["cats.example"] = [PUBLIC]
    dns["v6.example"] = ["2606:4700::1111"]
    raw = chat(
        image("http://cats.example:8080/cat.png?size=2"),
        image("http://user@v6.example/dog.png"),
        image("https://cats.example/cat.png"),
        image(f"http://{PUBLIC}/direct.png"),
        image("data:image/png;base64,AAAA"),
    )
    request = await parse(raw)
    parts = sent(request, raw)["messages"][0]["content"]
    assert [p["image_url"]["url"] for p in parts[1:]] == [
        f"http://{PUBLIC}:8080/cat.png?size=2",
        "http://user@[2606:4700::1111]/dog.png",
        # TLS checks the name: an https URL keeps it (every address it resolved to was public).
        "https://cats.example/cat.png",
        f"http://{PUBLIC}/direct.png",
        "data:image/png;base64,AAAA",
    ]
    assert sent(request, raw)["max_tokens"] == 8


async def test_the_operators_allowlist_lets_private_sources_through(
    dns: dict[str, list[str]],
) -> None:
    dns["files.internal"] = ["10.1.2.3"]
    policy = MediaPolicy.of(["10.0.0.0/8", "media.corp"])
    raw = chat(image("http://files.internal/a.png"), image("http://media.corp/b.png"))
    request = await parse(raw, policy)
    urls = [p["image_url"]["url"] for p in sent(request, raw)["messages"][0]["content"][1:]]
    # A name on the allowlist is trusted as it is: not resolved, not rewritten.
    assert urls == ["http://10.1.2.3/a.png", "http://media.corp/b.png"]
    assert (await refused(chat(image("http://127.0.0.1/")), policy)).param is not None


async def test_a_name_that_does_not_resolve_or_hangs_is_a_400_in_bounded_time(
    dns: dict[str, list[str]],
) -> None:
    error = await refused(chat(image("http://nowhere.example/a.png")))
    assert error.code == "unresolvable_url"
    dns["slow.example"] = ["hang"]
    started = time.monotonic()
    error = await refused(chat(image("http://slow.example/a.png")), MediaPolicy(timeout_s=0.2))
    assert error.code == "unresolvable_url"
    assert time.monotonic() - started < 2


async def test_a_request_naming_too_many_hosts_is_refused_before_any_lookup() -> None:
    raw = chat(*(image(f"http://h{i}.example/a.png") for i in range(MAX_MEDIA_HOSTS + 1)))
    assert (await refused(raw)).code == "too_many_media_hosts"


async def test_a_large_body_parsed_in_a_worker_is_checked_and_pinned_the_same(
    dns: dict[str, list[str]],
) -> None:
    dns["cats.example"] = [PUBLIC]
    parser = BodyParser(0, 1, 30.0)  # every body goes to a worker process
    try:
        raw = chat(image("http://cats.example/cat.png"))
        request = await parser.parse(CHAT, raw)
        url = sent(request, raw)["messages"][0]["content"][1]["image_url"]["url"]
        assert url == f"http://{PUBLIC}/cat.png"
        with pytest.raises(ApiError) as caught:
            await parser.parse(CHAT, chat(image("http://127.0.0.1:8001/admin/v1/keys")))
        assert caught.value.code == "media_url_not_allowed"
    finally:
        parser.close()
