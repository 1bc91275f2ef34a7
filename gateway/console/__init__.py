"""The web console: pages and assets served on the gateway's admin listener (gateway/console/
routes.py), reading the cluster through a `ClusterConsole` the process that runs the gateway
hands in (gateway/console/source.py)."""
