"""verl's releases as data: which are known and supported, which one a command checks, and each
one's own files, environment and facts.

``index`` (``data/releases.yaml``: every release pinned by its wheel and tree), ``choice`` (the
release a command checks, and why), ``wheels`` (a release's files from its pinned wheel, in the
user cache), ``environment`` and ``lock`` (the environment its upstream code runs in, built once
from sha256-pinned wheels), ``lines`` (the project's citations found in each release's own
lines). Nothing here imports or runs upstream's code; only pip and a new venv run.
"""
