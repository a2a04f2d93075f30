"""``python -m pytest_verl_compat.cli``: the same as the ``verl-compat`` command."""

from pytest_verl_compat.cli import main

raise SystemExit(main())
