"""The large-prompt figures of the gateway bench: the bodies, the paced load beside the small
requests, and the lines that compare llmgw's CPU per byte with the hop's."""

from __future__ import annotations

import asyncio
import json
from typing import cast

from bench.gateway import large
from bench.gateway.loadgen import build_request, run_load
from bench.gateway.standin import Answers, StandinProtocol


def test_the_shapes_are_200_kb_of_varied_text_and_the_same_every_run() -> None:
    shapes = large.shapes("mock")
    assert shapes == large.shapes("mock")
    for name, body in shapes.items():
        raw = json.dumps(body, separators=(",", ":")).encode()
        assert large.PROMPT_BYTES <= len(raw) < large.PROMPT_BYTES * 1.1, name
        messages = cast(list[dict[str, str]], body["messages"])
        words = " ".join(m["content"] for m in messages).split()
        assert len(set(words)) > 50, name
    assert len(cast(list[object], shapes["transcript"]["messages"])) == large.TURNS


async def test_a_paced_connection_waits_between_requests() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: StandinProtocol(Answers()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    request = build_request("127.0.0.1", port, "/v1/chat/completions", {"model": "m"}, None)
    try:
        paced = await run_load(
            "127.0.0.1", port, request, concurrency=1, duration_s=0.3, warmup_s=0.0, pause_s=0.05
        )
    finally:
        server.close()
        await server.wait_closed()
    assert paced.errors == 0
    assert 2 <= paced.completed <= 7  # about one request each 50 ms


def figures(name: str, cpu_s_per_mb: float, added: float) -> large.LargeFigures:
    shapes = [
        large.ShapeFigures(shape, 205_000, 500.0, 150.0, cpu_s_per_mb, added, 0.5, 2.0)
        for shape in ("one string", "transcript")
    ]
    return large.LargeFigures(name, 0.3, 1.0, shapes)


def test_the_lines_give_llmgws_cpu_per_byte_against_the_hops() -> None:
    arms = [
        large.LargeFigures("direct", 0.02, 0.05, [large.ShapeFigures("one string", 205_000)]),
        figures("hop", 0.002, 0.0005),
        figures("llmgw", 0.0029, 0.001),
    ]
    text = "\n".join(large.lines(arms))
    assert "llmgw proxy CPU per byte, the hop's measured apart (one string): 1.45x" in text
    assert "(less a small request's CPU: 2.00x; goal 1.5x, judged in the paired rounds)" in text
    arms[2] = figures("llmgw", 0.004, 0.001)
    assert "the hop's measured apart (transcript): 2.00x" in "\n".join(large.lines(arms))
    markdown = large.markdown(arms)
    assert markdown.count("| hop |") == 2
    assert "- llmgw proxy CPU per byte" in markdown
    assert large.lines([]) == []
