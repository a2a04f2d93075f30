"""The memory forecast (issue 47): what each rank of a verl run holds, per role and phase.

Only ``cli``, ``plugin`` and the tests import this layer; it imports ``model``, ``checks`` and
``pipeline``. This face names what they may use; the modules hold one concern each.
"""
