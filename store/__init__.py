"""The gateway's store: API keys, usage, upstream keys and the engine-key master secret.

One interface (`Store`), two backends: a SQLite file by default and PostgreSQL when a URL is
given. Callers get one from `open_store` and never name a backend.
"""

from store.base import KeyNameTaken, Store
from store.factory import open_store
from store.models import ApiKey, KeyLimits, StoreDump, UsageDelta, UsageRow

__all__ = [
    "ApiKey",
    "KeyLimits",
    "KeyNameTaken",
    "Store",
    "StoreDump",
    "UsageDelta",
    "UsageRow",
    "open_store",
]
