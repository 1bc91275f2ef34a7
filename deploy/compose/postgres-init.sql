-- Run once, when the PostgreSQL volume is first created: a database for llmgw's store (API keys,
-- usage, the engine-key master secret), beside Temporal's own `temporal` and
-- `temporal_visibility` databases that Temporal's setup step creates.
CREATE DATABASE llmgw;
