"""Print the commands a document shows under a heading, as written, for a shell to run.

    python .ci/doc_commands.py DOC HEADING [--first]

HEADING is a part of the section's heading text; ``--first`` prints only its first command. The
commands come from the extractor tests/test_docs_commands.py checks the documents with (bash and
console blocks, ``\\`` continuations kept, comments left out), so what CI runs is what the
document says. A console block's documented output is compared with the command's stdout, line
for line (``diff`` fails the script under ``set -e``), as tests/test_docs_commands.py compares
it for the sections it runs. No command under the heading is an error: a renamed section must
not turn the CI step into a no-op.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_docs_commands import Command, documented_commands


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("doc", help="a document, relative to the repository (README.md)")
    parser.add_argument("heading", help="part of the heading of the section to print")
    parser.add_argument("--first", action="store_true", help="only the section's first command")
    args = parser.parse_args()
    commands = [c for c in documented_commands(args.doc) if args.heading in c.section]
    if not commands:
        print(f"{args.doc}: no command under a heading with {args.heading!r}", file=sys.stderr)
        return 2
    print("\n".join(_shell(c) for c in (commands[:1] if args.first else commands)))
    return 0


# Ends the documented output in the here-document that ``diff`` reads (no line of a document's
# output is this).
_END = "__VERL_COMPAT_DOCUMENTED_OUTPUT__"


def _shell(command: Command) -> str:
    """The command as the document writes it; with documented output, its stdout compared."""
    if command.output is None:
        return command.text
    expected = "\n".join(command.output)
    return (
        f'__stdout="$(mktemp)"\n{{ {command.text}\n}} > "$__stdout"\n'
        f"diff -u - \"$__stdout\" <<'{_END}'\n{expected}\n{_END}"
    )


if __name__ == "__main__":
    sys.exit(main())
