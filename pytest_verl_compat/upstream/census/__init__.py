"""The census: what upstream checks and reads, from its source, and which of it ``check`` runs.

``checks`` lists every ``raise`` and ``assert`` of main_ppo's path (``call_binding``: what a
condition reads), ``checks_run`` runs the probes on the census's configurations and writes the
page (``docs/census/<version>/checks.md``); ``reads`` places every leaf's reads (``static_reads`` from the
source, ``reads_probe`` traced in the oracle), ``reads_page`` writes its page; ``off_path`` keeps
the leaves whose every read the configuration can rule out (``effect.off-path``), and ``explain``
judges one key on one configuration. Each census is of the checked release's own files.
"""
