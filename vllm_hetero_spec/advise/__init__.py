"""``advise``: which drafter, which rule, what speedup, from short measured runs."""
