"""Run a few lines of Python in a release's own environment, for tests of upstream's own code.

verl is never imported where the checker (and this suite) runs: a test that compares with one of
upstream's functions sends its lines to the release's interpreter (``runner.release_interpreter``,
the checker's packages on its path, nothing else of this environment), and gets back the JSON of
the ``result`` they set.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from typing import Any

from corpus_facts import PINNED_VERSION

# The release's interpreter: the checker's packages first on its path, then the lines from stdin.
_BOOTSTRAP = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); namespace = {}; "
    "exec(compile(sys.stdin.read(), '<test>', 'exec'), namespace); "
    "print(json.dumps(namespace['result']))"
)


def run_in_release(source: str, version: str = PINNED_VERSION, timeout: float = 600) -> Any:
    """The JSON value of ``result`` after ``source`` ran in ``version``'s environment."""
    from pytest_verl_compat.upstream.oracle.runner import release_interpreter, sandbox_environment

    interpreter = release_interpreter(version)
    assert interpreter.python is not None and interpreter.checker is not None
    done = subprocess.run(
        [interpreter.python, "-I", "-c", _BOOTSTRAP, interpreter.checker],
        input=textwrap.dedent(source),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sandbox_environment(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
