"""``slrs``: the first target token drawn from the drafter's string-level law psi."""
