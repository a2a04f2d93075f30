"""A case's verdict: the static findings and upstream's own early checks, as ``check`` gives it.

``early`` asks (or finds kept) upstream's answers and turns its failures into findings, ``case``
joins them with the compile report into the verdict every front end shows, ``rules`` holds the
pages of the rules whose findings no static check gives, ``examples`` records verl's own example
scripts' verdicts.
"""
