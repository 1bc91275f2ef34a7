"""The model workflow (workflow.py) and what it is made of: the rules it decides by (rules.py),
the replicas it starts and checks, moves, autoscaling, external routes and adoption, the calls it
makes, and its clients' view (api.py, client.py), which the gateway imports without the rest."""
