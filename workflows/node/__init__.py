"""The node workflow (workflow.py): a node's registration and its signed proof (proof.py), its
liveness and the watch that tells it (liveness.py, watch.py), its calls out (calls.py), and the
rules it decides by (rules.py)."""
