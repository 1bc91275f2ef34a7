"""`llmgw bench gateway`: the gateway's speed against a stand-in upstream, side by side with a
bare Python hop and LiteLLM's proxy. See main.py."""
