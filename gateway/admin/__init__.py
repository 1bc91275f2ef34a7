"""The admin API: keys, models, routes and usage, each a router of its own, every one behind the
loopback and same-site checks of guard.py."""
