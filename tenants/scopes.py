"""API key scopes. A key holds a subset; permission classes map HTTP methods to the scope they need."""

ADAPTERS_READ = "adapters:read"
ADAPTERS_WRITE = "adapters:write"
KEYS_MANAGE = "keys:manage"
INFERENCE = "inference"
ALL_SCOPES = (ADAPTERS_READ, ADAPTERS_WRITE, KEYS_MANAGE, INFERENCE)
