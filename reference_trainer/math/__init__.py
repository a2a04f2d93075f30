"""verl's pure math, re-implemented: advantages, loss aggregation, KL, policy and value losses, log-probs.

Each family is a name registry (``registry.Registry``) like verl's ``core_algos``; the conformance
stage compares every registered entry with upstream's function of the same name.
"""
