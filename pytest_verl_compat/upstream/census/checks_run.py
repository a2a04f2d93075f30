"""The census's coverage run and its page: which of upstream's configuration checks ``check`` runs.

Every corpus case and composed example script that launches ``main_ppo`` (the census is about its
trees; the SFT trainer's cases compose another tree) and the variants of ``census_variants.yaml``
go to the oracle as ``checks`` questions carrying the census's deciding lines; the oracle runs the
probes under a line tracer and answers which of those lines ran. An entry is evaluated when one of
its deciding lines ran for at least one configuration.

Each answer's lines are recorded under its ``answer_key`` (the question, the installed packages,
our oracle code) in ``golden/answers/census.json``: a question whose key is recorded is not asked
again, so ``census --check`` re-renders the page from the recorded lines in seconds, and a changed
probe, verl or configuration is a key that misses, asked anew.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.model import Case, StageFailed, StageUnavailable, line_spans
from pytest_verl_compat.pipeline.answers import (
    CHECKS,
    UserAnswers,
    answer_key,
    code_sha256,
    load_recorded,
    mapping_digest,
    recorded_path,
)
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.manifest import (
    default_examples_path,
    default_manifest_path,
    load_examples,
    load_manifest,
)
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.census import checks as census
from pytest_verl_compat.upstream.oracle.client import ENTRY_MODULE, UpstreamOracle, checks_request
from pytest_verl_compat.upstream.probes.records import KEY_RAN

VARIANTS_FILE = Path(__file__).with_name("census_variants.yaml")
# The recorded coverage's file beside the golden files (``golden/answers/census.json``).
RECORDED_NAME = "census"
# JSON keys of one recorded answer: the configuration's id (for a reader), the lines that ran.
KEY_CONFIG = "config"


def _cases(session: AuditSession) -> list[Case]:
    """The corpus's cases and the example scripts (``corpus/examples.yaml``)."""
    assert session.manifest is not None
    return [*session.cases, *load_examples(default_examples_path(), session.manifest.bindings)]


def _main_ppo_outcomes(session: AuditSession, cases: list[Case]) -> Iterator[tuple[Case, Any]]:
    """The read cases that launch main_ppo, with their outcome."""
    for case in cases:
        try:
            outcome = session.outcome(case)
        except (StageFailed, StageUnavailable):
            continue  # not read: the script exits before its launcher
        if outcome.fields.module not in (None, ENTRY_MODULE):
            continue  # another entry point's tree (the SFT trainer's), not main_ppo's
        yield case, outcome


def explicit_keys(session: AuditSession) -> dict[str, list[str]]:
    """Each key that a main_ppo case of the corpus or an example script sets (``+``/``~``
    stripped), with the ids of the cases that set it: the read census's second denominator. A
    config group's choice (``model_engine=megatron``) is Hydra's, written ``group=`` here so that
    the census sets it apart (``read_census_page.hydra_own``)."""
    out: dict[str, list[str]] = {}
    composer = session.composer()
    for case, outcome in _main_ppo_outcomes(session, _cases(session)):
        for key in sorted({field_key(field) for field in outcome.fields.fields}):
            shown = f"{key}=" if composer.is_group(key) else key
            out.setdefault(shown, []).append(case.id)
    return dict(sorted(out.items()))


def configurations(session: AuditSession) -> dict[str, Mapping[str, Any]]:
    """Every composed configuration of the coverage run, by a stable id."""
    cases = _cases(session)
    out: dict[str, Mapping[str, Any]] = {}
    read: set[str] = set()
    for case, outcome in _main_ppo_outcomes(session, cases):
        read.add(case.id)
        composition = outcome.composition
        if composition.composed:
            out[case.id] = composition.mapping
    citations = load_release_index().citations
    by_id = {case.id: case for case in cases}
    raw = yaml.safe_load(VARIANTS_FILE.read_text(encoding="utf-8")) or []
    for index, variant in enumerate(raw):
        if session.version not in variant.get("releases", [session.version]):
            continue
        overrides = tuple(variant["overrides"])
        if variant["base"] is None:
            composition = session.composer().compose(overrides, {})
        else:
            # A corpus case, or an example script by its id (examples/…/run_x, no .sh).
            base = by_id.get(variant["base"])
            if base is None:
                raise ValueError(f"{VARIANTS_FILE.name} entry {index}: no case {variant['base']!r}")
            if base.id not in read:
                if session.version != citations:
                    continue  # an example script this release's checkout does not launch so
                raise ValueError(f"{VARIANTS_FILE.name} entry {index}: {base.id} is not read")
            # Composed under its own id: a case whose scripts this release's checkout lacks is
            # read from golden under the base's id, never under the variant's.
            extended = session.with_overrides(base, overrides, case_id=f"census/{index}")
            composition = session.outcome(extended).composition
        if not composition.composed:
            if session.version != citations:
                continue  # a variant of a setting this release's tree does not have
            raise ValueError(f"{VARIANTS_FILE.name} entry {index}: {composition.reason}")
        out[f"census/{index}"] = composition.mapping
    return out


def recorded_file(session: AuditSession) -> Path:
    return recorded_path(session.golden_dir, RECORDED_NAME)


def coverage(
    configs: Mapping[str, Mapping[str, Any]],
    entries: list[census.Entry],
    recorded: Mapping[str, Any] | None = None,
    workers: int = 2,
    *,
    release: str,
) -> tuple[dict[str, set[int]], dict[str, Any]]:
    """The watched lines that ran, over every configuration, and the answers by key to record.

    A configuration whose question's key is in ``recorded`` is read from there; the others are
    asked of one oracle process (none started when every key is recorded)."""
    watch = census.watched_lines(entries)
    if not watch:
        raise ValueError("no upstream check to watch: the census found no file of its scope")
    questions = {cid: checks_request(mapping, watch) for cid, mapping in configs.items()}
    keys = {
        cid: answer_key(CHECKS, question, release=release) for cid, question in questions.items()
    }
    known = recorded or {}
    answers: dict[str, Any] = {}
    asked = [cid for cid in configs if not _recorded_answer(known.get(keys[cid]))]
    for cid in configs:
        if cid not in asked:
            answers[keys[cid]] = {KEY_CONFIG: cid, KEY_RAN: dict(known[keys[cid]][KEY_RAN])}
    if asked:
        oracle = UpstreamOracle(workers, release=release)
        try:
            for cid in asked:
                oracle.submit(f"census:{cid}", questions[cid])
            for cid in asked:
                answer = oracle.answer(f"census:{cid}", questions[cid])
                if KEY_RAN not in answer:
                    raise RuntimeError(
                        f"{cid}: the oracle gave no coverage: {answer.get('error', answer)}"
                    )
                answers[keys[cid]] = {
                    KEY_CONFIG: cid,
                    KEY_RAN: {
                        relative: line_spans(lines)
                        for relative, lines in sorted(answer[KEY_RAN].items())
                    },
                }
        finally:
            oracle.close()
    ran: dict[str, set[int]] = {}
    for answer in answers.values():
        for relative, text in answer[KEY_RAN].items():
            ran.setdefault(relative, set()).update(lines_of(text))
    return ran, answers


def lines_of(text: str) -> set[int]:
    """The lines of ``spans``' text."""
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        found.update(range(int(lo), int(hi or lo) + 1))
    return found


def _recorded_answer(entry: Any) -> bool:
    """A recorded entry this code can read (anything else is asked anew)."""
    if not (isinstance(entry, dict) and isinstance(entry.get(KEY_RAN), dict)):
        return False
    try:
        for text in entry[KEY_RAN].values():
            lines_of(text)
    except (AttributeError, TypeError, ValueError):
        return False
    return True


# The census pages of a release: ``docs/census/<version>/checks.md`` and ``reads.md``.
CENSUS_PAGES = "docs/census"


def scripts_release() -> str:
    """The release whose example scripts the census reads (a checkout holds them; a wheel does
    not): the embedded corpus's, whose examples list pins them."""
    return load_manifest(default_manifest_path()).upstream.version


def census_page(version: str, kind: str) -> str:
    """The path of a release's census page (``checks`` or ``reads``), from the repository's top."""
    return f"{CENSUS_PAGES}/{version}/{kind}.md"


def render(
    version: str,
    entries: list[census.Entry],
    ran: Mapping[str, set[int]],
    reasons: list[census.Reason],
    configurations: int,
) -> str:
    """The page (Markdown), byte-stable for the same release and the same probes."""
    counts = census.summary(entries, dict(ran), reasons)
    done = census.evaluated(entries, dict(ran))
    config = counts["config"]
    share = 100.0 * counts["config_evaluated"] / config if config else 100.0
    page, reads_page = census_page(version, "checks"), census_page(version, "reads")
    reasons_path = f"pytest_verl_compat/data/releases/{version}/census_reasons.yaml"
    lines = [
        f"# verl {version}'s checks on the main_ppo V1 path: the census",
        "",
        f"Generated by `verl-compat census --release {version} --write {page}` from verl "
        f"{version}'s own files and its code, run in its own environment "
        "(`pytest_verl_compat/upstream/census/checks.py`); do not edit. Every `raise` and "
        "`assert` of the files below, with the condition that decides it and what that condition "
        "reads: `config` (configuration values), `data` (the batch, the model's tensors), "
        "`internal` (upstream's own invariants), or `elsewhere` (a function the V1 path never "
        "calls).",
        "",
        "How an entry is classified (`pytest_verl_compat/upstream/census/call_binding.py`): by what its "
        "condition reads. It is `config` when the probes saw a configuration key read on a line "
        "that decides it (its guard, the assignments the condition uses, an assert's test: the "
        f"traced reads recorded for `{reads_page}`, shown as `traced: key`), or when, "
        "read from the source, the condition (for an unconditional "
        "`raise`, its message) names a field of a configuration object (an attribute, `.get` or "
        "item of `config`, `cfg`, `…_config`, a parameter typed with one of verl's config classes, "
        "`self` in a config class), a local assigned from one in the same function, an attribute "
        "of `self` a method of its class assigns from one, or a parameter its callers in these "
        "files pass one (followed through up to four calls). The column *config values read* "
        "shows the first two, a derived name with where it comes from (`←`). A condition that "
        "reads no configuration is `data` when it names the batch or the model's tensors "
        "(`shape`, `mask`, `batch`, `token`, …), else `internal`; those words never decide "
        "whether a condition is `config`. A label other than the reading's carries a written "
        f"reason from `{reasons_path}` (a value passed through a `**kwargs` dict or by a "
        "caller outside these files, a function main_ppo's V1 path never calls), shown in the "
        "last column.",
        "",
        "A configuration entry is *evaluated* when `verl-compat check`'s probes ran its deciding "
        f"line on at least one of {configurations} configurations (the corpus cases and verl's "
        "example scripts that launch `main_ppo`, and `census_variants.yaml`); otherwise it says "
        f"why not (`{reasons_path}`).",
        "",
        f"Check that this page is the one verl {version} and the probes give now (exit 1 when "
        "not). The probes' answers are recorded by content with the release's golden answers "
        "(`census.json`, each under the key of its question, the release's pinned environment "
        "and our oracle code), so with nothing changed the check reads them and takes seconds; "
        "a changed probe, release or configuration asks the oracle again (minutes on 2 cores) "
        "and the check fails until `--write` re-records. With verl's example scripts in the "
        f"checkout `verl-v{scripts_release()}`:",
        "",
        "```bash",
        f"verl-compat census --release {version} --upstream verl-v{scripts_release()} --check {page}",
        "```",
        "",
        "| entries | config | data | internal | elsewhere | config evaluated | config not evaluated, explained | unexplained |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {counts['entries']} | {config} | {counts['data']} | {counts['internal']} | {counts['elsewhere']} | "
        f"{counts['config_evaluated']} ({share:.1f}%) | "
        f"{config - counts['config_evaluated'] - len(counts['unexplained'])} | {len(counts['unexplained'])} |",
        "",
    ]
    for file in sorted({e.file for e in entries}):
        lines += [
            f"## `{file}`",
            "",
            "| line | function | check | config values read | reads | evaluated |",
            "| ---: | --- | --- | --- | --- | --- |",
        ]
        for entry in (e for e in entries if e.file == file):
            relabel = census.relabel_reason(entry, reasons)
            if entry.depends == "elsewhere":
                status = "not on the V1 path: " + census.reason_for(entry, reasons)
            elif entry.depends != "config":
                status = f"— ({relabel})" if relabel else "—"
            elif entry.where in done:
                status = "yes"
            else:
                status = "no: " + (census.reason_for(entry, reasons) or "**unexplained**")
            check = entry.condition or entry.statement
            read = "<br>".join(f"`{_cell(r, 70)}`" for r in entry.reads[:2]) or "—"
            if relabel and entry.depends == "config" and entry.where in done:
                status = f"yes ({relabel})"
            lines.append(
                f"| {entry.line} | `{entry.function}` | `{_cell(check)}` | {read} | "
                f"{entry.depends} | {status} |"
            )
        lines.append("")
    return "\n".join(lines)


def _cell(text: str, limit: int = 110) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# The read census's traced half (``read_census``): the probes' reads, asked with ``reads_probe``.
READS_NAME = "reads"
READS_PROBE = "pytest_verl_compat.upstream.census.reads_probe"
KEY_READS = "reads"
KEY_CONFIGURATIONS = "configurations"


def reads_configurations(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The read census's configurations: the corpus's main_ppo cases and the variants (verl's
    example scripts add sizes and paths, not other code paths, at twice the time)."""
    return {cid: mapping for cid, mapping in configs.items() if not cid.startswith("examples/")}


def reads_key(configs: Mapping[str, Mapping[str, Any]], wanted: set[str], release: str) -> str:
    """One key for the whole traced run: every configuration, the leaves kept, the probes and
    the handler."""
    question = {
        "kind": READS_NAME,
        "handler": code_sha256(("pytest_verl_compat/upstream/census/reads_probe.py",)),
        "mappings": [mapping_digest(dict(configs[cid])) for cid in sorted(configs)],
        "leaves": mapping_digest(sorted(wanted)),
    }
    return answer_key(CHECKS, question, release=release)


def traced_reads(
    configs: Mapping[str, Mapping[str, Any]],
    wanted: set[str],
    recorded: Mapping[str, Any] | None = None,
    workers: int = 2,
    *,
    release: str,
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Leaf → the ``verl/…py:line`` places the probes read it, over every configuration (only
    the ``wanted`` leaves), and the answer to record; from ``recorded`` when its key is there."""
    key = reads_key(configs, wanted, release)
    known = (recorded or {}).get(key)
    if isinstance(known, dict) and isinstance(known.get(KEY_READS), dict):
        return dict(known[KEY_READS]), {key: known}
    from pytest_verl_compat.upstream.census import reads_probe

    merged: dict[str, set[str]] = {}
    oracle = UpstreamOracle(workers, served=(READS_PROBE,), release=release)
    try:
        for cid, mapping in configs.items():
            oracle.submit(f"reads:{cid}", {"kind": reads_probe.KIND, "mapping": dict(mapping)})
        for cid, mapping in configs.items():
            answer = oracle.answer(
                f"reads:{cid}", {"kind": reads_probe.KIND, "mapping": dict(mapping)}
            )
            if reads_probe.KEY_READS not in answer:
                raise RuntimeError(f"{cid}: the oracle gave no reads: {answer.get('error')}")
            for where, keys in answer[reads_probe.KEY_READS].items():
                for leaf in keys:
                    if leaf in wanted:
                        merged.setdefault(leaf, set()).add(where)
    finally:
        oracle.close()
    reads = {
        leaf: sorted(places, key=lambda w: (w.rpartition(":")[0], int(w.rpartition(":")[2])))
        for leaf, places in sorted(merged.items())
    }
    return reads, {key: {KEY_CONFIGURATIONS: len(configs), KEY_READS: reads}}


def traced_reads_of(mapping: Mapping[str, Any], key: str, release: str) -> list[str]:
    """The ``verl/…py:line`` places the probes read ``key`` at on one configuration: one oracle
    question (~8-10 s with verl's import), kept in the user cache by content (the mapping, the
    probes and the handler, as ``reads_key``), so asking about another key of the same script
    reads it."""
    from pytest_verl_compat.upstream.census import reads_probe

    question = {"kind": reads_probe.KIND, "mapping": dict(mapping)}
    cache = UserAnswers(READS_NAME)
    cache_key = reads_key({"explain": mapping}, set(), release)
    answer = cache.get(cache_key)
    if not isinstance(answer, dict) or not isinstance(answer.get(reads_probe.KEY_READS), dict):
        oracle = UpstreamOracle(1, served=(READS_PROBE,), release=release)
        try:
            answer = oracle.answer("explain", question)
        finally:
            oracle.close()
        if reads_probe.KEY_READS not in answer:
            raise RuntimeError(f"the oracle gave no reads: {answer.get('error')}")
        cache.put(cache_key, {reads_probe.KEY_READS: answer[reads_probe.KEY_READS]})
    found = [where for where, keys in answer[reads_probe.KEY_READS].items() if key in keys]
    return sorted(found, key=lambda w: (w.rpartition(":")[0], int(w.rpartition(":")[2])))


def recorded_traced(golden_dir: Path) -> dict[str, dict[int, list[str]]]:
    """The probes' traced reads recorded for the read census (``golden/answers/reads.json``), by
    file and line: what the census adds to its reading of the source (``census.scan``). Their
    staleness is ``census --reads --check``'s."""
    recorded = load_recorded(recorded_path(golden_dir, READS_NAME))
    reads: dict[str, list[str]] = next(
        (v[KEY_READS] for v in recorded.values() if KEY_READS in v), {}
    )
    return census.traced_by_line(reads)
