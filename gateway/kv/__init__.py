"""The gateway's side of the engines' KV-cache events: the node agents' KV feeds it reads
(feeds.py) and the external engines' publishers it subscribes to (publishers.py), both filling
the block index the router reads."""
