"""The drafter: the draft model's per-request state and the step that drafts for a batch.

Rooms, by concern:

- ``runtime/``: the draft model on vLLM's machinery (model, paged KV, layout, CUDA
  graphs, input staging, TP group) and the one place every ``auto`` runtime setting
  becomes concrete (``runtime/config.py``);
- ``strategies/``: what each rule does differently (one module per family, ``slrs``
  with its string-level law psi), registered once in ``strategies/registry.py``;
- ``placement/``: where drafting runs (in process, a Ray actor, pipelined);
- here: the engine (request state, the shared draft loop) and the messages it
  exchanges with the proposer.
"""
