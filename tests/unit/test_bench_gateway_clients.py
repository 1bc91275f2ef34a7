"""The upstream-client benchmark (bench/gateway/clients.py) measures each client on the same
work: every client reads the stand-in's whole answer, plain and streamed, and the table's
ratios are to aiohttp's figure of the same shape."""

import asyncio
import json

from bench.gateway import clients, standin
from tests.ports import free_port


async def test_every_client_reads_the_whole_answer_and_is_measured() -> None:
    port = free_port()
    answers = standin.Answers(standin.DEFAULT_CHUNKS)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: standin.StandinProtocol(answers), clients.HOST, port)
    try:
        figures = await clients._run_all(port, clients.CLIENTS, 2, 0.05, 0.2)
        # The plain answer is the stand-in's JSON completion, read whole.
        post, close = await clients._client("llmgw", "", port)
        body = json.dumps({"model": "mock", "messages": clients.MESSAGES}).encode()
        assert await post(body) == len(standin.completion_body())
        await close()
    finally:
        server.close()
    assert [(f.client, f.shape) for f in figures] == [
        (c, shape) for shape in ("plain", "stream") for c in clients.CLIENTS
    ]
    assert all(f.requests > 0 and f.cpu_us_per_request > 0 for f in figures)


def test_the_table_gives_each_client_as_a_ratio_of_aiohttp_of_the_same_shape() -> None:
    figures = [
        clients.ClientFigures("aiohttp", "plain", 10, 100.0, 1.0),
        clients.ClientFigures("raw", "plain", 10, 10.0, 1.0),
        clients.ClientFigures("aiohttp", "stream", 10, 200.0, 1.0),
        clients.ClientFigures("raw", "stream", 10, 50.0, 1.0),
    ]
    rows = [line.split() for line in clients.lines(figures)[1:]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("aiohttp", "plain", "1.00"),
        ("raw", "plain", "0.10"),
        ("aiohttp", "stream", "1.00"),
        ("raw", "stream", "0.25"),
    ]
