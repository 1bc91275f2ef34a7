"""Which payload key `llmgw up` uses (workflows/payload_codec.py), and making one.

Once a state dir's Temporal database holds encrypted payloads, every later `up` on it must
seal and open with the same key, or nothing in it reads back; so a key file in the state dir is
used whether or not `--encrypt-payloads` is given again, and removing it is not how encryption
is turned off.
"""

from collections.abc import Mapping
from pathlib import Path

from workers.secret_files import write_secret_file
from workers.temporal_flags import PAYLOAD_KEY_VARIABLE
from workflows.payload_codec import new_key_line, read_payload_keys

UP_KEY_FILE = "payload.key"


def up_payload_key(state_dir: Path, env: Mapping[str, str], make: bool) -> Path | None:
    """$LLMGW_PAYLOAD_KEY_FILE, else the state dir's key file if there is one, else a new one
    when `make`; None: payloads in clear. Raises PayloadKeyError for a file that cannot be
    used."""
    named = env.get(PAYLOAD_KEY_VARIABLE)
    path = Path(named).expanduser().absolute() if named else state_dir.absolute() / UP_KEY_FILE
    if not named and not path.exists():
        if not make:
            return None
        write_secret_file(path, new_key_line())
    read_payload_keys(path)  # refused now, with its name, rather than by every child
    return path
