"""What an operator looks at after the fact: the last requests this gateway served
(request_log.py, one RequestRecord each, record.py) and their figures over the last hour in
fixed time buckets (series.py), both in this process's memory and bounded."""
