"""Every construct family the reader models, against real bash: never a value bash would not give.

Each script runs twice: read by the reader, and run by real bash in the sandbox
(``bash_oracle.run_bash_sandboxed``: the script's own text at the same path, nothing real but
bash and the pure programs the reader models, every other command a silent success, as the
reader assumes). A case expects either the same launch (``SAME``: argv, environment, folder), or
a refusal naming its construct, file and line: a construct whose value the reader does not model
must be a run-time value or a refusal, never a value. ``LAUNCH`` stands for
``python3 -m verl.trainer.main_ppo``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reader_checks import LAUNCH, agrees_with_bash, needs_bash

from pytest_verl_compat.bash import LaunchRead, LaunchReadError

SAME = "same"

# family -> [(script, SAME or the construct of the refusal, and the variables it is given)]
Case = tuple[str, str, dict[str, str]]
FAMILIES: dict[str, list[Case]] = {
    "quoting and continuations": [
        # A backslash, spaces, then the newline: `\ ` is a word of one space, and the newline
        # ends the command; the next line is a command of its own.
        ("LAUNCH a \\  \n  b=1\n", SAME, {}),
        ('LAUNCH a \\ \nb=2\nLAUNCH "$b"\n', SAME, {}),
        ("LAUNCH a \\\t\n", SAME, {}),
        ("LAUNCH a\\  \n", SAME, {}),
        ("LAUNCH a \\\n  b \\\n  c\n", SAME, {}),
        ("LAUNCH a \\\n\n", SAME, {}),
        ("LAUNCH a \\ \\ \n", SAME, {}),
        # A lone backslash at the very end of the script continues into nothing: it vanishes.
        ("LAUNCH a \\", SAME, {}),
        ("LAUNCH a\\", SAME, {}),
        ("LAUNCH a \\\\", SAME, {}),
        ("LAUNCH 'a\\' \"b\\\\\" $'c\\td' \"$'x'\"\n", SAME, {}),
        ("LAUNCH \"a\\\nb\" 'c\\\nd'\n", SAME, {}),
        ('A=( a \\  \n b )\nLAUNCH "${A[@]}"\n', SAME, {}),
        ('X="a \\  \n b"\nLAUNCH "$X"\n', SAME, {}),
    ],
    "command substitution": [
        ('X=$(echo a b)\nLAUNCH "$X" $X\n', SAME, {}),
        ('X=`echo a`\nLAUNCH "$X"\n', SAME, {}),
        ('X="$(printf \'%s\\n\\n\' a)"\nLAUNCH "[$X]"\n', SAME, {}),
        # `$(< FILE)` prints the file bash reads, never read here: a run-time value.
        ('echo content > f.txt\nX=$(< f.txt)\nLAUNCH "a=$X"\n', "run-time value", {}),
        ('echo content > f.txt\nX=$(0< f.txt)\nLAUNCH "a=$X"\n', "run-time value", {}),
        ('echo c > f.txt\nLAUNCH "a=`< f.txt`"\n', "run-time value", {}),
        # Anything else but one redirection alone prints nothing.
        ('echo c > f.txt\nX=$(echo a; < f.txt)\nLAUNCH "a=$X"\n', SAME, {}),
        ('echo c > f.txt\nX=$(X=1 < f.txt)\nLAUNCH "a=$X"\n', SAME, {}),
        ('echo c > f.txt\nX=$(< f.txt 2>/dev/null)\nLAUNCH "a=$X"\n', SAME, {}),
        ('echo c > f.txt\nX=$(1< f.txt)\nLAUNCH "a=$X"\n', SAME, {}),
        # A program this reader does not model prints what only the run knows.
        ('X=$(date)\nLAUNCH "a=$X"\n', "run-time value", {}),
        ("X=$(date)\nLAUNCH a\n", SAME, {}),
        ('D="$(cd "$(dirname "$0")" && pwd)"\nLAUNCH "d=$D"\n', SAME, {}),
    ],
}


def _cases() -> list[tuple[str, int, Case]]:
    return [(family, i, case) for family, cases in FAMILIES.items() for i, case in enumerate(cases)]


@needs_bash
@pytest.mark.parametrize(
    ("family", "number", "case"), _cases(), ids=[f"{f}-{i}" for f, i, _ in _cases()]
)
def test_a_construct_reads_as_bash_runs_it_or_is_refused(
    family: str, number: int, case: Case, tmp_path: Path
) -> None:
    script, expected, env = case
    read = agrees_with_bash(script.replace("LAUNCH", LAUNCH), tmp_path, env)
    if expected == SAME:
        assert isinstance(read, LaunchRead), f"{family}: {read}"
    else:
        assert isinstance(read, LaunchReadError), f"{family}: read {read}, expected {expected}"
        assert read.construct == expected, read
        assert read.line is not None


# --------------------------------------------------------------------------- through a function

DATE = "date +%Y%m%d"
# The real `date` prints its output and one newline; the binding holds it without the newline.
DATE_PROGRAM = {"date": 'printf "20260101\\n"'}


@needs_bash
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ('now() { date +%Y%m%d; }\nTS=$(now)\nLAUNCH "ts=$TS"\n', SAME),
        ('now() { date +%Y%m%d 2>/dev/null; }\nTS=$(now)\nLAUNCH "ts=$TS"\n', SAME),
        ('now() { printf a; date +%Y%m%d; }\nLAUNCH "ts=$(now)"\n', SAME),
        ('now() { echo "$(date +%Y%m%d)"; }\nLAUNCH "ts=$(now)-x"\n', SAME),
        # The newlines `date` ends with are unknown where more output follows them, or where
        # a pipe keeps them.
        ('now() { date +%Y%m%d; echo x; }\nLAUNCH "ts=$(now)"\n', "run-time value"),
        ('now() { date +%Y%m%d | tr -d 0; }\nLAUNCH "ts=$(now)"\n', "run-time value"),
        ('now() { date +%Y%m%d; }\nLAUNCH "ts=$(now 2>&1)"\n', "run-time value"),
        # Another command is not the bound one.
        ('now() { date +%Y; }\nLAUNCH "ts=$(now)"\n', "run-time value"),
    ],
)
def test_a_substitution_through_the_scripts_function_answers_from_the_same_binding(
    script: str, expected: str, tmp_path: Path
) -> None:
    read = agrees_with_bash(
        script.replace("LAUNCH", LAUNCH),
        tmp_path,
        substitutions={DATE: "20260101"},
        programs=DATE_PROGRAM,
    )
    if expected == SAME:
        assert isinstance(read, LaunchRead), read
        assert "20260101" in read.argv[0]
    else:
        assert isinstance(read, LaunchReadError) and read.construct == expected, read


@needs_bash
def test_an_unbound_substitution_through_a_function_stays_a_run_time_value(
    tmp_path: Path,
) -> None:
    read = agrees_with_bash(
        f'now() {{ date +%Y%m%d; }}\nTS=$(now)\n{LAUNCH} "ts=$TS"\n',
        tmp_path,
        programs=DATE_PROGRAM,
    )
    assert isinstance(read, LaunchReadError)
    assert (read.construct, read.line) == ("run-time value", 3)
    assert "$(now) (line 2)" in read.detail
