"""The gateway: the OpenAI-compatible front door and the store of keys and usage it owns."""
