"""URLs of things served on a node's address, which may be IPv6 (written in brackets)."""


def http_base(host: str, port: int) -> str:
    """http://<host>:<port>, with an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
