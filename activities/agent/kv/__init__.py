"""The node agent's KV feed: one subscriber per local engine that publishes KV events
(subscriptions.py), what they hold and every change to it (hub.py), served to gateways over HTTP
(feed_server.py), put together for the agent process (service.py)."""
