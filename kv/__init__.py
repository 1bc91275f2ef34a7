"""vLLM's KV-cache events, on the ground floor beside workflows/: decoding (events.py), where a
subscriber stands in a publisher's sequence (sequence.py), the ZeroMQ subscriber the agent and the
gateway share (subscriber.py), block hashes (hashes.py), the block index (index.py) and the
agent's feed protocol (feed.py). Imports nothing else of llmgw's."""
