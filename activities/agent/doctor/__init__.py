"""`llmgw doctor`: what a node's GPUs, NVLink, fabric and engines need, checked and explained.

facts.py holds what is concluded from, gather.py reads it off the machine, parsing.py turns text
into facts, the *_checks modules judge, checks.diagnose orders the findings (findings.py), and
report.py writes them as text or JSON.
"""
