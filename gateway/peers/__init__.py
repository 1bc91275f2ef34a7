"""The gateways' shared picture of the fleet: what each sent where, its requests in flight and
its breakers, told to every other gateway process on the same store (bus.py)."""

from gateway.peers.bus import PeerBus

__all__ = ["PeerBus"]
