"""The draft model as it runs: vLLM's model class and attention backend over a paged KV
pool of the plugin's own, and the concrete runtime config its ``auto`` settings resolve to."""
