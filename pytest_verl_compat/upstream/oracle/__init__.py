"""The oracle and its environments: the one way upstream's code runs, and how it is asked.

``runner`` starts every upstream process (``python -I`` in an empty folder with an allow-listed
environment, in the checked release's own environment, ``releases.environment``); ``warm`` and
``warm_process`` keep a template that imported verl once and fork each oracle from it;
``client`` is the parent's side of the oracle (questions by id, answers read later), ``process``
the oracle itself (it answers with the probes, ``upstream.probes``); ``trusted`` asks upstream's
entry point for its composition; ``entry_batch`` runs the entry points on many launches at once.
"""
