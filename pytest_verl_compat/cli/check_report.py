"""What ``verl-compat check`` prints: one result per checked file, in text, JSON, SARIF or GitHub's
workflow annotations.

- ``text``: one line per finding, ``FILE:LINE:COL: level[rule] key: message (fix)`` as ruff,
  mypy and shellcheck print theirs, then each file's two verdicts (stderr);
- ``json``: ``schema_version`` 1, validated by ``pytest_verl_compat/data/check.schema.json``;
- ``sarif``: SARIF 2.1.0 for GitHub code scanning (``upload-sarif``): every rule's page in
  ``tool.driver.rules``, each result with its ``ruleId``, level, message, a location relative to
  the working folder (``%SRCROOT%``, the repository root in CI) and a ``partialFingerprints``
  entry that survives moving the line;
- ``github``: ``::error file=…,line=…,col=…,title=…::message`` (``::warning``, ``::notice``).

Every SARIF result and every GitHub annotation has a file and a line (``_placed``): a location
outside the working folder (a key's default in an installed verl's tree) and a ``--set`` argument
cannot be annotated in a pull request, so they point at the launcher line of the script instead
and name the tree's line or the argument in the message (SARIF: ``relatedLocations``); a finding
about the whole file (no launcher) is on its first line; an unreadable input's error is on the
line it names, else the first (SARIF: a located ``toolExecutionNotifications`` entry).
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_verl_compat.checks import RuleDoc
from pytest_verl_compat.model import LEVELS, Finding, Location

SCHEMA_VERSION = 1
SARIF_SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
SRCROOT = "%SRCROOT%"
FORMATS = ("text", "json", "sarif", "github")
# How each level reads in SARIF and in GitHub's workflow commands.
SARIF_LEVELS = {"error": "error", "warning": "warning", "info": "note"}
GITHUB_COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}

FileStatus = Literal["checked", "not-a-launcher", "unreadable"]


@dataclass(frozen=True)
class WayResult:
    """One way of a script whose ways (at conditions only its run decides) give different
    verdicts: the conditions it takes and its verdicts."""

    when: str  # ``when [ -d "$HOME/models/Qwen" ] (line 2) is true``
    status: FileStatus
    valid: bool | None
    runnable: bool | None
    not_runnable: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "when": self.when,
            "status": self.status,
            "valid": self.valid,
            "runnable": self.runnable,
            "not_runnable": self.not_runnable,
        }


@dataclass
class FileResult:
    """One checked script or case: its findings (located, selected, not silenced) and verdicts."""

    label: str
    status: FileStatus = "checked"
    findings: list[Finding] = field(default_factory=list)
    silenced: int = 0
    valid: bool | None = None
    runnable: bool | None = None
    not_runnable: str = ""
    upstream_skipped: str = ""
    error: str = ""  # why an unreadable input could not be checked (one line)
    launcher: Location | None = None
    problems: tuple[str, ...] = ()  # why the reference trainer cannot run it (--profile)
    model_facts: bool | None = None  # whether a model's config.json was read
    case: str = ""  # the case id, when a case was named rather than a script
    # Each explicit key's answer (``verdict/keys.py``: acts, no effect, undecided), as JSON.
    keys: list[dict[str, Any]] = field(default_factory=list)
    # Each way's verdicts, when the script's ways at conditions only its run decides differ,
    # and the two verdicts said by way (``no when [ -f .env ] (line 3) is false; yes when …``).
    ways: list[WayResult] = field(default_factory=list)
    verdicts_by_way: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        named = {"case": self.case} if self.case else {}
        ways = {"ways": [way.to_json() for way in self.ways]} if self.ways else {}
        return {
            **named,
            **ways,
            "file": self.label,
            "status": self.status,
            "valid": self.valid,
            "runnable": self.runnable,
            "not_runnable": self.not_runnable,
            "upstream_skipped": self.upstream_skipped,
            "error": self.error,
            "silenced": self.silenced,
            "findings": [finding_json(f) for f in self.findings],
            "keys": list(self.keys),
        }


@dataclass(frozen=True)
class CheckRun:
    """Everything one ``check`` call found, and what it was run with."""

    results: Sequence[FileResult]
    version: str  # the verl release the verdicts speak of (the one checked)
    tool_version: str
    rules: dict[str, RuleDoc]
    cwd: Path
    # Why that release was checked (``releases.choice``: the flag, a setting, the installed verl).
    release_why: str = ""

    def counts(self) -> dict[str, int]:
        levels = Counter(f.level for r in self.results for f in r.findings)
        return {level: levels.get(level, 0) for level in LEVELS}

    def summary(self) -> dict[str, int]:
        statuses = Counter(r.status for r in self.results)
        return {
            "files": len(self.results),
            "valid": sum(1 for r in self.results if r.valid is True),
            "invalid": sum(1 for r in self.results if r.valid is False),
            "not_a_launcher": statuses.get("not-a-launcher", 0),
            "unreadable": statuses.get("unreadable", 0),
            "silenced": sum(r.silenced for r in self.results),
        }


def finding_json(finding: Finding) -> dict[str, Any]:
    location = finding.location
    when = {"when": finding.when} if finding.when else {}
    return {
        "rule": finding.rule,
        "level": finding.level,
        "path": finding.path,
        "message": finding.message,
        "fix": finding.fix,
        "evidence": finding.evidence,
        "location": location.to_json() if location is not None else None,
        **when,
    }


def _is_launch_path(path: str) -> bool:
    return not path.startswith("<") and not path.startswith("verl-compat:")


def finding_message(finding: Finding) -> str:
    """``key: message (fix)`` on one line; a finding not about a key omits the key; one about a
    way of the script ends with it (``[when … is true]``)."""
    fix = f" ({finding.fix})" if finding.fix else ""
    about = f"{finding.path}: " if _is_launch_path(finding.path) else ""
    # One line per finding, whatever the message holds (Hydra's messages span lines).
    message = " ".join(finding.message.split())
    when = f" [{' '.join(finding.when.split())}]" if finding.when else ""
    return f"{about}{message}{fix}{when}"


def finding_text(finding: Finding) -> str:
    """``level[rule] key: message (fix)``."""
    return f"{finding.level}[{finding.rule}] {finding_message(finding)}"


# --- text ------------------------------------------------------------------------------------


def text_lines(result: FileResult) -> list[str]:
    lines = []
    for finding in result.findings:
        location = finding.location
        where = str(location) if location is not None else result.label
        line = f"{where}: {finding_text(finding)}"
        if location is not None and location.origin in ("tree", "set"):
            what = "the default" if location.origin == "tree" else "set on the command line"
            line += f" [{what}, for {result.label}]"
        lines.append(line)
    return lines


def verdict_lines(result: FileResult, version: str, many: bool = False) -> list[str]:
    """The two verdicts: two lines with the reasons for one file, one short line per file of many
    (the reasons are the findings above)."""
    if result.verdicts_by_way:
        return _way_verdicts(result, version, many)
    if result.status != "checked" or result.valid is None:
        return []
    valid = f"valid for verl {version}: {'yes' if result.valid else 'no'}"
    if result.runnable is None:
        return [f"{result.label}: {valid}" if many else valid]
    if many:
        runnable = "yes" if result.runnable else "no"
        return [f"{result.label}: {valid}; runnable by the reference trainer: {runnable}"]
    runnable = "yes" if result.runnable else f"no ({result.not_runnable})"
    return [valid, f"runnable by the reference trainer: {runnable}"]


def _way_verdicts(result: FileResult, version: str, many: bool) -> list[str]:
    """A script whose ways give different verdicts: each verdict, said by way."""
    valid, runnable = result.verdicts_by_way
    if many:
        return [f"{result.label}: valid for verl {version}: {valid}"]
    lines = [f"valid for verl {version}: {valid}"]
    if result.runnable is not None:
        lines.append(f"runnable by the reference trainer: {runnable}")
    return lines


def summary_line(run: CheckRun) -> str:
    s = run.summary()
    counts = run.counts()
    found = ", ".join(f"{n} {level}{'s' if n != 1 else ''}" for level, n in counts.items() if n)
    parts = [
        f"checked {s['files']} file{'s' if s['files'] != 1 else ''}: "
        f"{s['valid']} valid for verl {run.version}, {s['invalid']} not"
    ]
    if s["not_a_launcher"]:
        parts.append(f"{s['not_a_launcher']} with no verl launcher")
    if s["unreadable"]:
        parts.append(f"{s['unreadable']} unreadable")
    line = "; ".join(parts) + f"; findings: {found or 'none'}"
    if s["silenced"]:
        line += f" ({s['silenced']} silenced by directives)"
    return line


# --- JSON ------------------------------------------------------------------------------------


def json_report(run: CheckRun) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "verl-compat", "version": run.tool_version},
        "verl_version": run.version,
        "release": {"version": run.version, "chosen_by": run.release_why},
        "files": [r.to_json() for r in run.results],
        "summary": {**run.summary(), "findings": run.counts()},
    }


# --- SARIF and GitHub annotations -------------------------------------------------------------


def _under(path: str, cwd: Path) -> str | None:
    """The path relative to ``cwd`` (POSIX), or None when it is outside it or not a file."""
    if path.startswith("<"):
        return None
    absolute = Path(path) if os.path.isabs(path) else cwd / path
    absolute = Path(os.path.normpath(absolute))
    if not absolute.is_relative_to(cwd):
        return None
    return absolute.relative_to(cwd).as_posix()


def _placed(finding: Finding, result: FileResult, cwd: Path) -> tuple[Location, str]:
    """Where SARIF and GitHub show the finding, and what to add to its message when that is not
    the finding's own place. Every finding has one: its own location when it is a file under
    ``cwd`` (what a pull request can annotate); else the launcher line of the script, naming the
    ``--set`` argument or the tree's default it stands for; else its own location elsewhere;
    else the first line of the checked file (a finding about the whole file)."""
    own = finding.location
    if own is not None and _is_file(own.file) and _under(own.file, cwd) is not None:
        return own, ""
    note = ""
    if own is not None and own.origin == "tree":
        note = f" [the default is written at {own}]"
    elif own is not None and own.origin == "set":
        note = f" [set by argument {own.column} of the command line]"
    launcher = result.launcher
    if launcher is not None and _is_file(launcher.file):
        return launcher, note
    if own is not None and _is_file(own.file):
        return own, ""
    return _file_start(result), note


# A script read from standard input without --stdin-filename: named ``-`` where a file is due.
STDIN_LABEL = "<stdin>"


def _is_file(path: str) -> bool:
    return bool(path) and (path == STDIN_LABEL or not path.startswith("<"))


def _file_start(result: FileResult) -> Location:
    """The first line of the checked file."""
    return Location(result.label if _is_file(result.label) else STDIN_LABEL, 1, 0, "script")


def _error_place(result: FileResult) -> Location:
    """Where an unreadable input's one-line error points: ``FILE:LINE:`` when it starts so."""
    head, _, rest = result.error.partition(":")
    line, colon, _ = rest.partition(":")
    if head == result.label and colon and line.isdigit():
        return Location(result.label, int(line), 0, "script")
    return _file_start(result)


def _region(location: Location) -> dict[str, int]:
    region = {"startLine": max(location.line, 1)}
    if location.column:
        region["startColumn"] = location.column
    return region


def _artifact(path: str, cwd: Path) -> dict[str, str]:
    if path == STDIN_LABEL:
        return {"uri": "-"}
    relative = _under(path, cwd)
    if relative is not None:
        return {"uri": urllib.parse.quote(relative), "uriBaseId": SRCROOT}
    return {"uri": Path(os.path.normpath(cwd / path)).as_uri()}


def _physical(location: Location, cwd: Path) -> dict[str, Any]:
    return {
        "physicalLocation": {
            "artifactLocation": _artifact(location.file, cwd),
            "region": _region(location),
        }
    }


def _fingerprint(finding: Finding, file: str) -> str:
    # Stable while the line moves: the rule, the file and the keys (not the line, not the
    # message, whose numbers may change with the values).
    text = "\0".join((finding.rule, file, finding.path))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _sarif_rule(doc: RuleDoc) -> dict[str, Any]:
    short = doc.summary.split(". ")[0].rstrip(".") + "."
    help_text = f"{doc.summary}\n\nWhy: {doc.why}\n\nFix: {doc.fix}"
    return {
        "id": doc.id,
        "name": doc.id,
        "shortDescription": {"text": short},
        "fullDescription": {"text": doc.summary},
        "help": {"text": help_text, "markdown": help_text},
        "defaultConfiguration": {"level": SARIF_LEVELS[doc.level]},
        "properties": {"tags": [doc.id.split(".")[0]], "precision": "high"},
    }


def sarif_report(run: CheckRun) -> dict[str, Any]:
    ids = list(run.rules)
    results = []
    for result in run.results:
        for finding in result.findings:
            entry: dict[str, Any] = {
                "ruleId": finding.rule,
                "level": SARIF_LEVELS[finding.level],
            }
            if finding.rule in run.rules:
                entry["ruleIndex"] = ids.index(finding.rule)
            location, note = _placed(finding, result, run.cwd)
            entry["message"] = {"text": finding_message(finding) + note}
            entry["locations"] = [_physical(location, run.cwd)]
            entry["partialFingerprints"] = {
                "verlCompatFinding/v1": _fingerprint(finding, location.file)
            }
            own = finding.location
            if own is not None and own is not location and own.line and _is_file(own.file):
                if own.origin == "tree":
                    entry["relatedLocations"] = [
                        {
                            "id": 1,
                            "physicalLocation": {
                                "artifactLocation": _artifact(own.file, run.cwd),
                                "region": _region(own),
                            },
                            "message": {"text": "the default is written here"},
                        }
                    ]
            entry["properties"] = {
                "keys": finding.path,
                "evidence": finding.evidence,
                "file": result.label,
                **({"when": finding.when} if finding.when else {}),
            }
            results.append(entry)
    notifications = [
        {
            "level": "error",
            "message": {"text": result.error},
            "locations": [_physical(_error_place(result), run.cwd)],
        }
        for result in run.results
        if result.status == "unreadable"
    ]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "verl-compat",
                        "version": run.tool_version,
                        "rules": [_sarif_rule(doc) for doc in run.rules.values()],
                    }
                },
                "originalUriBaseIds": {SRCROOT: {"uri": run.cwd.as_uri() + "/"}},
                # The release every result speaks of, and why it was the one checked.
                "properties": {"verlRelease": run.version, "verlReleaseChosenBy": run.release_why},
                "columnKind": "unicodeCodePoints",
                "invocations": [
                    {
                        "executionSuccessful": not notifications,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": results,
            }
        ],
    }


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_lines(run: CheckRun) -> list[str]:
    """GitHub Actions workflow commands, one per finding and one per unreadable input, each with
    its file and line (a file outside the working folder is named as it is: GitHub shows it in
    the run's log, not on the pull request)."""
    lines = []
    for result in run.results:
        for finding in result.findings:
            location, note = _placed(finding, result, run.cwd)
            properties = [*_github_place(location, run.cwd)]
            properties.append(f"title={_escape_property(f'verl-compat {finding.rule}')}")
            message = _escape_data(finding_message(finding) + note)
            lines.append(f"::{GITHUB_COMMANDS[finding.level]} {','.join(properties)}::{message}")
    for result in run.results:
        if result.status == "unreadable":
            place = ",".join(_github_place(_error_place(result), run.cwd))
            lines.append(f"::error {place},title=verl-compat::{_escape_data(result.error)}")
    return lines


def _github_place(location: Location, cwd: Path) -> list[str]:
    file = "-" if location.file == STDIN_LABEL else _under(location.file, cwd) or location.file
    place = [f"file={_escape_property(file)}", f"line={max(location.line, 1)}"]
    if location.column:
        place.append(f"col={location.column}")
    return place


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"
