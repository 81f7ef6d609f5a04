"""Each rule's drafting draft rule: how a position is sampled and how a step's draft
tokens become target-vocabulary proposals. Nothing outside this package branches on a
rule's name; ``registry.py`` maps names to draft rules and their traits."""
