"""The ground floor: message contracts, names, pure decisions and the workflows themselves.

Nothing here imports another llmgw package; everything else may import this one.
"""
