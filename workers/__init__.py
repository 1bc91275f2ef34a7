"""The top floor: processes, the CLI and `llmgw up`, wired from the packages below."""
