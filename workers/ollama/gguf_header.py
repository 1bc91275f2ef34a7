"""Reading the header of a GGUF file, the weights' format: that a model layer is one at all
(`check_gguf`: its magic), and whether its metadata has a chat template (`gguf_has_chat_template`),
found by walking the header's keys and skipping their values, each length bounded by the file's
size, without reading the tensors. Nothing here trusts the file: a header that cannot be read is
refused or answered None, never followed past the end.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

from workers.ollama.store import CHUNK, Blob, OllamaStore, OllamaStoreError

GGUF_MAGIC = b"GGUF"


def check_gguf(store: OllamaStore, blob: Blob) -> None:
    fd, _ = store.open_blob(blob)
    with os.fdopen(fd, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise OllamaStoreError(f"model layer {blob} is not a GGUF file (it starts {head!r})")


# GGUF metadata value types (ggml's gguf.h) and the bytes of the fixed-size ones.
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


def gguf_has_chat_template(path: Path) -> bool | None:
    """Whether a GGUF file's metadata has `tokenizer.chat_template` (what llama-server applies to
    chat requests); None when its header cannot be read. Reads the header only, skipping the
    values (a vocabulary is a long array of strings), each length bounded by the file's size."""
    try:
        with path.open("rb", buffering=CHUNK) as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(4) != GGUF_MAGIC:
                return None
            version, _tensors, count = struct.unpack("<IQQ", _exact(f, 20))
            if version < 2:
                return None
            for _ in range(count):
                key = _exact(f, _length(f, size)).decode("utf-8", "replace")
                if key == CHAT_TEMPLATE_KEY:
                    return True
                _skip_value(f, struct.unpack("<I", _exact(f, 4))[0], size)
            return False
    except (OSError, ValueError, struct.error):
        return None


def _exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF header")
    return data


def _length(f: BinaryIO, bound: int) -> int:
    (n,) = struct.unpack("<Q", _exact(f, 8))
    if n > bound:
        raise ValueError("GGUF length past the end of the file")
    return int(n)


def _skip(f: BinaryIO, n: int) -> None:
    f.seek(n, os.SEEK_CUR)


def _skip_value(f: BinaryIO, kind: int, bound: int) -> None:
    if kind in _GGUF_FIXED:
        _skip(f, _GGUF_FIXED[kind])
    elif kind == _GGUF_STRING:
        _skip(f, _length(f, bound))
    elif kind == _GGUF_ARRAY:
        (inner,) = struct.unpack("<I", _exact(f, 4))
        count = _length(f, bound)
        if inner in _GGUF_FIXED:
            _skip(f, _GGUF_FIXED[inner] * count)
        elif inner == _GGUF_STRING:
            for _ in range(count):
                _skip(f, _length(f, bound))
        else:
            raise ValueError(f"GGUF array of type {inner}")
    else:
        raise ValueError(f"GGUF value type {kind}")
