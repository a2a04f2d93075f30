"""Launch reader: the argv of a script's final launch of an entry module, never run.

By default the launch is ``python3 -m verl.trainer.main_ppo`` (what every caller above the
reader assumes); ``read_launch(..., entry_modules=...)`` accepts other entry modules (dotted
names or a predicate, among the modules of the entry packages in ``data/entry_packages.txt``)
and returns the script's final launch of any of them, run by ``python [OPTIONS] -m MODULE``,
``python PATH/verl/.../module.py``, ``torchrun [OPTIONS] (-m MODULE | PATH.py)`` or ``python -m
torch.distributed.run``: ``LaunchRead`` names the module, the launcher, torchrun's options and
the world size it starts (see ``entry_points`` and ``launcher``).

The script is parsed by mvdan/sh's ``shfmt --to-json`` and the typed syntax tree is interpreted
here, with bash semantics, for the subset of bash that launch scripts use.  Nothing the script
names is ever executed: a command substitution is answered from ``Bindings.substitutions`` or
by interpreting its body (``cd``, ``pwd``, ``dirname``, ``basename``, ``realpath``, ``echo``,
``printf`` and the script's own functions are pure functions of known text; a program the
reader skips prints the bound output of its own command text, as ``$(TEXT)``), and every
construct whose effect cannot be known statically raises :class:`LaunchReadError` naming the
file, the line and the construct (``$(< FILE)`` prints a file never read: a run-time value).
The launcher may run under wrappers (``ray job submit``, ``uv run``, ``env``, ``nohup``,
``timeout``, ``srun``, ``docker exec``, ``conda run``: the registry in ``wrappers``, their tables
built from each tool's documented option list in ``data/wrappers``), whose options are read and
checked, never run; ``LaunchRead`` then carries the environment and folder the wrapped launcher
gets.  ``source`` reads files of the read's :class:`SourceScope` only (the script's folder tree,
or a manifest case's pinned inputs); ``LaunchRead.sources`` lists them with their sha256.

Run-time values: what only the running script knows (an unbound command substitution, a
variable bash sets such as ``$PWD``, ``~`` with HOME unset, ``$$``) is carried as a marker
inside the text (NUL, its number, NUL: no bash value can hold a NUL, so it cannot be forged)
that records where it came from.  It may be assigned, copied, concatenated, exported, given to
skipped commands (``mkdir -p "$PWD/logs"``) or transformed (``${PWD##*/}`` is a run-time value
of its own).  Only where its text decides something is it refused, with the line it came from,
the line that needs it and the binding that fixes it: the launcher's argv, a condition (an
emptiness test passes when the value is certainly non-empty), a ``case`` subject or pattern,
arithmetic, the word count of an unquoted expansion (loops, arrays, builtins, redirections; a
value of known characters, such as an arithmetic result, ``$RANDOM`` or ``$(date +%Y%m%d)``,
is one word whatever it is, and the launcher's log file is taken as one word, as an override's
value is), the name of the command run, or the arguments of Python, of a modelled builtin or of
a program that runs its arguments as a command.  Exported run-time values are listed in
``LaunchRead.runtime`` instead of ``exported``.  In the argv, the caller's ``carry`` decides
which overrides and torchrun options may keep one as a placeholder (those that only name).

Conditions only the running system decides (a file test, ``command -v NAME``, a test of a
run-time value) are followed both ways; where the ways part, the read takes the way
``Bindings.conditions`` names, else stops with ``LaunchForked`` (``branches``);
:func:`read_launch_ways` reads every way (``ways``).

Deliberate differences from bash, each documented where it is implemented:

* Pathname expansion is never performed.  An unquoted word that still holds ``*``, ``?`` or
  ``[`` after expansion stays literal, which is what bash produces when nothing matches.
* Commands other than the shell builtins and programs modelled here are skipped as if they
  succeeded (status 0; ``cd`` into a folder is assumed to exist, so ``while ! ray status``
  ends at once); their output matters only through ``substitutions``.  A builtin reached
  through ``builtin``/``command`` is the builtin itself.  Refused instead: a child shell
  (``bash -c``, code piped or fed into ``sh``, ``nohup bash ...``), ``hash -p``, a function
  named like a command this reader models, and any change to ``PATH`` before the launcher,
  since each can make ``python3`` run something else unseen.
* A script read from its file runs as ``bash /absolute/path/to/it``: ``$0`` is that path.
  ``realpath``, ``readlink -f`` and ``pwd -P`` resolve links as this machine has them.
* Input is bounded before shfmt sees it: a regular file of at most 1 MiB, brackets nested at
  most 200 deep, shfmt itself capped in memory and time.  NUL bytes, carriage returns (which
  bash keeps in words) and invalid UTF-8 are refused with the line they are on.
* Variables bash sets by itself (``PWD``, ``PATH``, ``RANDOM``, ...) are run-time values unless
  bound in ``Bindings.variables`` (arrays such as ``BASH_ARGV`` are errors); ``IFS``,
  ``OPTIND`` and ``OPTERR`` start as bash starts them, whatever the environment holds, and
  ``BASH_SOURCE``, ``FUNCNAME``, ``PIPESTATUS`` and ``BASH_REMATCH`` are kept as bash keeps them.
  Other unset variables are unset, as under ``env -i``: the bindings are the whole environment.
* Text whose meaning depends on the locale (non-ASCII in ``${#X}``, slices, patterns, case
  changes, IFS, regular expressions or ``$'\\u...'``) is rejected: the audit's oracle runs bash
  in the C locale.
* ``source NAME`` without a slash: bash looks on PATH first. A PATH only known at run time is
  taken to hold no file of that name (recipes source files beside them); a known PATH is
  searched, and a file found there is refused.
* A file test (``[ -f .env ]``) is never answered from the disk, even for a file the script
  could source: the file system of the run may differ from the reader's.

The modules, each importing only those before it (no import cycle, and no module takes a
name starting with ``_`` from another): ``errors`` (what is raised, the budgets and the
exceptions that unwind the interpreter), ``results`` (what a read gives: the launch, its
carried values and the conditions it took), ``parse`` (shfmt and the tree), ``words``
(quoting, fields and the ASCII value helpers), ``arrays`` (associative arrays in bash's
order), ``scope`` (which files ``source`` may read), ``shapes`` (the characters some run-time
values are made of), ``state`` (the shell and its variables), ``arithmetic``, ``braces``,
``patterns``, ``expansion``, ``conditions`` (``[[ ]]``, ``test`` and ``=~`` over the pure
``regex``), ``programs`` (output, ``cd`` and the coreutils path programs, over the pure
``paths`` and ``printing``), ``stdin`` (input and what reads it, over the pure ``filters``),
``declarations``, ``builtins``, ``functions``, ``traps``, ``sources``, ``launcher`` (Python,
torchrun and the wrappers, over the pure ``entry_points`` and ``wrappers``, whose tables come
from ``wrapper_tables``), ``branches`` and ``interpreter`` (statements), and ``ways`` (every
way through the conditions only the running system decides).  The interpreter is one class
stacked from a mixin per layer, ``state`` at the bottom; the few calls that go up the stack are
declared on ``State`` for the type checker.
"""

from __future__ import annotations

from pytest_verl_compat.bash.errors import LaunchExited, LaunchForked, LaunchReadError
from pytest_verl_compat.bash.interpreter import read_launch, read_launch_text
from pytest_verl_compat.bash.parse import command_substitutions
from pytest_verl_compat.bash.results import CarriedValue, LaunchRead, TakenCondition
from pytest_verl_compat.bash.scope import SourceScope
from pytest_verl_compat.bash.ways import MAX_WAYS, Way, read_launch_ways

__all__ = [
    "MAX_WAYS",
    "CarriedValue",
    "LaunchExited",
    "LaunchForked",
    "LaunchRead",
    "LaunchReadError",
    "SourceScope",
    "TakenCondition",
    "Way",
    "command_substitutions",
    "read_launch",
    "read_launch_text",
    "read_launch_ways",
]
