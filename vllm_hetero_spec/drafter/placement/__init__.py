"""Where drafting runs: in the engine's process, or in a Ray actor (optionally pipelined)."""
