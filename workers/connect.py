"""Connecting to Temporal from a long-running process, which may start before the server."""

import asyncio
import logging

from temporalio.client import Client

from workers.paths import Locations
from workflows.client import connect

log = logging.getLogger(__name__)


async def connect_with_retry(where: Locations, attempts: int = 60) -> Client:
    for attempt in range(1, attempts + 1):
        try:
            return await connect(where.temporal, where.namespace, where.security)
        except RuntimeError as err:
            if attempt == attempts:
                raise
            if attempt == 1:
                log.warning(
                    "waiting for Temporal at %s (%s): %s",
                    where.temporal,
                    where.security.describe(),
                    err,
                )
            await asyncio.sleep(min(0.2 * attempt, 2.0))
    raise AssertionError("unreachable")
