"""``verl-compat rule [ID]``: a rule's page, or the list of rules; ``--write`` regenerates
docs/rules.md from the same registry (tests/test_rule_pages.py fails when the file is stale)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks import Example, RuleDoc
from pytest_verl_compat.cli.common import EXIT_OK, UsageError, did_you_mean
from pytest_verl_compat.pipeline.snapshot import write_atomic
from pytest_verl_compat.upstream.verdict.rules import all_rules

DOC_TITLE = "# Rules of `verl-compat check`"


def example_command(example: Example, overrides: tuple[str, ...], version: str) -> str:
    """The example as a command; a base script is named in the checkout the README clones."""
    sets = " ".join(f"--set {override}" for override in overrides)
    script = example.base.endswith(".sh")
    base = f"verl-v{version}/{example.base}" if script else example.base
    options = "".join(f" {option}" for option in example.options)
    return f"verl-compat check {base}{options} {sets}".rstrip()


def _model_note(example: Example, twin: bool = False) -> str:
    model = example.twin_model if twin and example.twin_model is not None else example.model
    if not model:
        return ""
    facts = ", ".join(f"{key}={value}" for key, value in sorted(model.items()))
    return f" (with --model-config: a config.json with {facts})"


def page_lines(doc: RuleDoc, version: str) -> list[str]:
    """The rule's page as ``verl-compat rule ID`` prints it."""
    lines = [f"{doc.id} ({doc.level}; {doc.source})", "", "What it checks:", f"  {doc.summary}"]
    lines += ["", "Why (upstream):", f"  {doc.why}"]
    if doc.example is not None:
        note = _model_note(doc.example)
        lines += [
            "",
            f"Fires{note}:",
            f"  {example_command(doc.example, doc.example.fires, version)}",
        ]
        twin = _model_note(doc.example, twin=True) if doc.example.twin_model is not None else ""
        lines += [
            f"Its valid twin{twin}:",
            f"  {example_command(doc.example, doc.example.twin, version)}",
        ]
    lines += ["", "Fix:", f"  {doc.fix}"]
    return lines


def markdown(rules: dict[str, RuleDoc], version: str) -> str:
    """docs/rules.md: one section per rule, from the registry."""
    out = [
        DOC_TITLE,
        "",
        "Generated from the registry; do not edit. Regenerate it (tests/test_rule_pages.py fails",
        "when it is stale) with:",
        "",
        "```bash",
        "verl-compat rule --write docs/rules.md",
        "```",
        "",
        "Each rule: what it checks, the upstream code that makes it true, an example that fires",
        "and its near-identical valid twin (both run by tests/test_rule_pages.py), and the fix.",
        "Select or ignore rules by id or family (`--select batch`, `--ignore upstream`), or on one",
        "line of a script with `# verl-compat: ignore[RULE]`.",
        "",
        "| rule | level | source |",
        "| --- | --- | --- |",
    ]
    out += [f"| [`{d.id}`](#{_anchor(d.id)}) | {d.level} | {d.source} |" for d in rules.values()]
    for doc in rules.values():
        out += ["", f"## {doc.id}", "", f"**{doc.level}**, {doc.source}. {doc.summary}", ""]
        out += [f"**Why:** {doc.why}", ""]
        if doc.example is not None:
            note = _model_note(doc.example)
            out += [f"Fires{note}:", "", "```text"]
            out += [example_command(doc.example, doc.example.fires, version), "```", ""]
            twin = _model_note(doc.example, twin=True) if doc.example.twin_model else ""
            out += [f"Its valid twin{twin}:", "", "```text"]
            out += [example_command(doc.example, doc.example.twin, version), "```", ""]
        out += [f"**Fix:** {doc.fix}"]
    return "\n".join(out) + "\n"


def _anchor(rule: str) -> str:
    # GitHub's heading anchors: lower case, dots dropped, spaces to dashes.
    return rule.lower().replace(".", "")


def pinned_version() -> str:
    from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest

    return load_manifest(default_manifest_path()).upstream.version


def pinned_rules() -> dict[str, RuleDoc]:
    """Every rule's page, its evidence filled with the embedded manifest's verl version and the
    default profile."""
    from pytest_verl_compat.memory import findings  # noqa: F401  (registers the memory.* pages)
    from pytest_verl_compat.pipeline.profile import default_profile

    return all_rules(pinned_version(), default_profile())


def cmd_rule(args: argparse.Namespace) -> int:
    rules = pinned_rules()
    if args.write:
        write_atomic(Path(args.write), markdown(rules, pinned_version()))
        return EXIT_OK
    if args.markdown:
        sys.stdout.write(markdown(rules, pinned_version()))
        return EXIT_OK
    if args.id is None:
        for doc in rules.values():
            summary = doc.summary.split(". ")[0].rstrip(".")
            print(f"{doc.id:50} {doc.level:8} {summary}")
        return EXIT_OK
    page = rules.get(args.id)
    if page is None:
        raise UsageError(
            f"no rule {args.id!r}{did_you_mean(args.id, list(rules))} (verl-compat rule lists them)"
        )
    print("\n".join(page_lines(page, pinned_version())))
    return EXIT_OK


def add_rule_parser(sub: Any) -> None:
    rule = sub.add_parser(
        "rule", help="print a rule's page (what it checks, why, an example, the fix), or list them"
    )
    rule.add_argument("id", nargs="?", metavar="ID", help="a rule id (e.g. batch.padded-step)")
    rule.add_argument("--markdown", action="store_true", help="print every page as Markdown")
    rule.add_argument("--write", metavar="PATH", help="write every page as Markdown to PATH")
    rule.set_defaults(func=cmd_rule)
