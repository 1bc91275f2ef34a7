"""SOURCE strings for `llmgw mirror add`, parsed without touching anything."""

import pytest

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.http_download import parse_content_range
from activities.control.mirror.sources import (
    BadSource,
    HfSource,
    LocalSource,
    OllamaSource,
    UrlSource,
    parse_source,
    public_url,
)
from activities.control.mirror.store import check_ref_name

HEX = "ab" * 32


def test_paths_are_local_sources() -> None:
    assert parse_source("/m/model.gguf") == LocalSource("/m/model.gguf")
    assert parse_source("./dir") == LocalSource("./dir")


def test_url_with_digest_fragment_and_credentials() -> None:
    source = parse_source(f"https://u:pw@host:8443/a/m.gguf?sig=secret#sha256={HEX.upper()}")
    assert isinstance(source, UrlSource)
    assert source.sha256 == f"sha256:{HEX}"
    assert source.url == "https://u:pw@host:8443/a/m.gguf?sig=secret"
    # What a manifest records: no user, password, query or fragment.
    assert source.public == "https://host:8443/a/m.gguf"


def test_sha256_option_and_fragment_must_agree() -> None:
    assert parse_source("http://h/m", sha256=HEX) == UrlSource("http://h/m", f"sha256:{HEX}")
    with pytest.raises(BadSource, match="disagree"):
        parse_source(f"http://h/m#sha256={'cd' * 32}", sha256=HEX)
    with pytest.raises(BadSource, match="not a sha256 digest"):
        parse_source("http://h/m", sha256="abc")
    with pytest.raises(BadSource, match="one downloaded file"):
        parse_source("/local", sha256=HEX)
    with pytest.raises(BadSource, match="#sha256="):
        parse_source("http://h/m#md5=x")


def test_hugging_face_forms() -> None:
    assert parse_source("hf://org/repo") == HfSource(
        "https://huggingface.co", "org/repo", "main", ()
    )
    got = parse_source("hf://org/repo@v1.0/a.gguf,sub/tok.json", hf_endpoint="http://m:9/")
    assert got == HfSource("http://m:9", "org/repo", "v1.0", ("a.gguf", "sub/tok.json"))


@pytest.mark.parametrize(
    "text",
    ["hf://repo", "hf://org/re po", "hf://../repo", "hf://org/repo@", "hf://org/repo/../x"],
)
def test_hugging_face_refusals(text: str) -> None:
    with pytest.raises(BadSource):
        parse_source(text)


def test_other_schemes() -> None:
    assert parse_source("ollama://smollm2:135m") == OllamaSource("smollm2:135m")
    with pytest.raises(BadSource, match="unknown scheme 'ftp'"):
        parse_source("ftp://h/x")
    with pytest.raises(BadSource, match="empty"):
        parse_source("  ")
    with pytest.raises(BadSource, match="http"):
        parse_source("hf://o/r", hf_endpoint="file:///etc")


def test_public_url_keeps_ipv6_brackets() -> None:
    assert public_url("http://user@[::1]:8080/x?q=1") == "http://[::1]:8080/x"


def test_content_range() -> None:
    assert parse_content_range("bytes 100-199/200") == (100, 199, 200)
    assert parse_content_range("bytes 0-9/*") == (0, 9, None)
    for bad in ("bytes 5-4/10", "bytes 0-10/10", "items 0-1/2", ""):
        with pytest.raises(MirrorError):
            parse_content_range(bad)


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 64, "a b"])
def test_ref_names_refused(name: str) -> None:
    with pytest.raises(MirrorError, match="not a mirror name"):
        check_ref_name(name)
