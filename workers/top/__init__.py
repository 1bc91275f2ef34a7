"""`llmgw top`: the curses loop (console.py), the pure figures (data.py) and screen (render.py),
and where the figures are read from (source.py)."""
