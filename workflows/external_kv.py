"""Checks on an external model's KV-cache event sources (Profile.external_kv), with errors that
name the field: run by the catalog (workflows/catalog.py) wherever a definition enters.

The gateway connects to each source over plain TCP (gateway/kv/publishers.py), so a source is
`tcp://HOST:PORT` with a host the gateway can reach: not a wildcard, which is what the engine
binds (`--kv-events-config '{"endpoint": "tcp://*:5557", ...}'`), and not ipc:// or inproc://,
which only reach processes on the engine's own machine. Pure.
"""

import re
from ipaddress import ip_address

from workflows.contracts import ExternalKv, Profile

TCP = "tcp://"
# vLLM's block sizes are small powers of two (16 by default on GPUs, 128 on CPUs); hybrid
# models stretch them to a few hundred tokens.
MAX_BLOCK_SIZE = 4096
MAX_TOPIC_CHARS = 256
# Python's own range for PYTHONHASHSEED (besides "random", which leaves no seed to reproduce).
MAX_HASH_SEED = 2**32 - 1
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def external_kv_problems(p: Profile) -> list[str]:
    """Problems as "external_kv...: why"; [] without external_kv."""
    kv = p.external_kv
    if kv is None:
        return []
    problems = []
    if len(kv.sources) != len(p.urls):
        problems.append(
            f"external_kv.sources: one per URL, in the order of urls: {len(p.urls)} URL(s), "
            f"{len(kv.sources)} source(s)"
        )
    for i, source in enumerate(kv.sources):
        where = f"external_kv.sources[{i}]"
        problems.extend(f"{where}.endpoint: {why}" for why in endpoint_problems(source.endpoint))
        if source.replay:
            problems.extend(f"{where}.replay: {why}" for why in endpoint_problems(source.replay))
            if source.replay == source.endpoint:
                problems.append(f"{where}.replay: the replay socket has a port of its own")
        if len(source.topic) > MAX_TOPIC_CHARS or not source.topic.isprintable():
            problems.append(f"{where}.topic: at most {MAX_TOPIC_CHARS} printable characters")
    endpoints = [source.endpoint for source in kv.sources]
    if len(set(endpoints)) != len(endpoints):
        problems.append("external_kv.sources: the same publisher is listed twice")
    problems.extend(_hashing_problems(kv))
    return problems


def _hashing_problems(kv: ExternalKv) -> list[str]:
    problems = []
    if not 1 <= kv.block_size <= MAX_BLOCK_SIZE:
        problems.append(
            f"external_kv.block_size: the engines' --block-size, 1 to {MAX_BLOCK_SIZE}, "
            f"not {kv.block_size}"
        )
    seed = kv.hash_seed
    if seed is not None and not (re.fullmatch(r"[0-9]{1,10}", seed) and int(seed) <= MAX_HASH_SEED):
        problems.append(
            f"external_kv.hash_seed: the engines' PYTHONHASHSEED, an integer from 0 to "
            f"{MAX_HASH_SEED}, not {seed!r}"
        )
    return problems


def endpoint_problems(endpoint: str) -> list[str]:
    """Why a ZMQ endpoint the gateway is to connect to is refused: [] for tcp://HOST:PORT."""
    if not endpoint.startswith(TCP):
        return [f"{endpoint!r} must be {TCP}HOST:PORT: the gateway connects over TCP"]
    host, sep, port = endpoint.removeprefix(TCP).rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        return [f"{endpoint!r} must end with :PORT, a port from 1 to 65535"]
    if host == "*":
        return [_wildcard(endpoint)]
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        if bracketed or not _HOSTNAME.fullmatch(host) or host.replace(".", "").isdigit():
            return [f"{endpoint!r}: {host!r} is not a host name or an IP address"]
        return []
    if address.version == 6 and not bracketed:
        return [f"{endpoint!r}: an IPv6 address goes in brackets, tcp://[{host}]:{port}"]
    if address.is_unspecified:
        return [_wildcard(endpoint)]
    return []


def _wildcard(endpoint: str) -> str:
    return (
        f"{endpoint!r} is a wildcard, the address the engine binds; give the address the "
        "gateway reaches it at"
    )
