"""Per-step policy beside the proposer: how many tokens to draft (``budget.py``) and,
with ``algorithm: auto``, which rule drafts each request (``rule_choice.py``). Neither
touches verification."""
