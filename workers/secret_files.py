"""Files that hold a secret: created 0600 from the start, never readable by others even briefly."""

import os
from pathlib import Path


def write_secret_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
