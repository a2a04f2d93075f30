"""The audit session: options, the manifest, the upstream tree, and per-case results cached per process."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_verl_compat.compose import Composer, Composition, count_leaves
from pytest_verl_compat.manifest import Case, Manifest, ManifestError, load_manifest
from pytest_verl_compat.read import ExplicitFields, read_case_fields
from pytest_verl_compat.snapshot import read_golden
from pytest_verl_compat.upstream import UpstreamError, UpstreamTree, locate_upstream


class StageUnavailable(Exception):
    """A stage cannot run here, for a reason that is not the case's fault (becomes a skip)."""


class StageFailed(Exception):
    """A stage failed for this case (becomes a test failure with this message)."""


def embedded_root() -> Path:
    """Folder holding ``corpus/`` and ``golden/``: the wheel's ``_embedded`` or the source tree."""
    packaged = Path(str(resources.files("pytest_verl_compat"))) / "_embedded"
    if (packaged / "corpus").is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class AuditOptions:
    """Options as builtin values (xdist ships them to workers)."""

    manifest: str | None = None
    upstream: str | None = None
    upstream_ini: str | None = None
    golden: str | None = None
    report: str | None = None
    conformance_report: str | None = None
    trusted: str = "auto"  # "auto": run when verl is installed; "off"; "require"
    rootdir: str = "."


@dataclass(frozen=True)
class CaseOutcome:
    """Where a case ended up after reading and composing."""

    fields: ExplicitFields | None
    fields_source: str  # "launch" or "golden"
    composition: Composition | None
    error: str = ""


@dataclass
class AuditSession:
    """Everything the stage tests share; built once per process from the options."""

    options: AuditOptions
    manifest: Manifest | None = None
    manifest_error: str = ""
    upstream: UpstreamTree | None = None
    upstream_reason: str = ""
    golden_dir: Path = Path("golden")
    conformance_error: str = ""
    _outcomes: dict[str, CaseOutcome] = field(default_factory=dict)
    _composer: Composer | None = None
    _conformance: list[Any] | None = None
    _reports: dict[str, Any] = field(default_factory=dict)
    _verdicts: dict[str, dict[str, str]] | None = None

    @classmethod
    def start(cls, options: AuditOptions) -> AuditSession:
        session = cls(options)
        root = embedded_root()
        rootdir = Path(options.rootdir)
        manifest_path = (
            Path(options.manifest) if options.manifest else root / "corpus" / "manifest.yaml"
        )
        if options.manifest and not manifest_path.is_absolute():
            manifest_path = Path.cwd() / manifest_path
        try:
            session.manifest = load_manifest(manifest_path)
        except ManifestError as exc:
            session.manifest_error = str(exc)
            return session
        if options.golden:
            session.golden_dir = (Path.cwd() / options.golden).resolve()
        elif session.manifest.golden_dir is not None:
            session.golden_dir = session.manifest.golden_dir
        else:
            session.golden_dir = root / "golden"
        try:
            session.upstream, session.upstream_reason = locate_upstream(
                session.manifest.upstream,
                option=options.upstream,
                ini=options.upstream_ini,
                rootdir=rootdir,
            )
        except UpstreamError as exc:
            session.upstream_reason = str(exc)
        return session

    @property
    def cases(self) -> tuple[Case, ...]:
        return self.manifest.cases if self.manifest else ()

    def conformance_cases(self) -> list[Any]:
        """The conformance stage's cases, from the tolerance file the manifest names."""
        if self._conformance is None:
            self._conformance = []
            if self.manifest is not None and self.manifest.conformance is not None:
                from pytest_verl_compat.conformance_plan import conformance_cases, load_tolerances

                try:
                    self._conformance = conformance_cases(
                        load_tolerances(self.manifest.conformance)
                    )
                except (OSError, ValueError, KeyError) as exc:
                    self.conformance_error = f"{self.manifest.conformance}: {exc}"
        return self._conformance

    def composer(self) -> Composer:
        if self.upstream is None:
            raise StageUnavailable(f"no upstream config tree: {self.upstream_reason}")
        if self._composer is None:
            assert self.manifest is not None
            self._composer = Composer(self.upstream.config_dir, self.manifest.upstream.config_name)
        return self._composer

    def read(self, case: Case) -> ExplicitFields:
        """Read stage: needs a checkout with the launch scripts."""
        if case.error:
            raise StageFailed(case.error)
        if self.upstream is None or not self.upstream.has_scripts:
            where = (
                "no upstream"
                if self.upstream is None
                else f"the {self.upstream.kind} at {self.upstream.root}"
            )
            raise StageUnavailable(
                f"{where} has no launch scripts; explicit fields come from the golden snapshot "
                f"{self.golden_path(case)} (pinned by the inputs' sha256). For the read stage, pass "
                "--verl-corpus-upstream PATH to a verl v0.9.0 checkout"
            )
        try:
            return read_case_fields(case, self.upstream.root)
        except Exception as exc:
            raise StageFailed(f"[{case.id}] {exc}") from exc

    def golden_path(self, case: Case) -> Path:
        return self.golden_dir / "compose" / f"{case.id}.json"

    def golden_fields(self, case: Case) -> ExplicitFields:
        """Explicit fields recorded in the golden snapshot, only if it pins the same inputs."""
        golden = read_golden(self.golden_dir, "compose", case.id)
        if golden is None:
            raise StageFailed(
                f"[{case.id}] no launch scripts here and no golden file {self.golden_path(case)}"
            )
        pinned = [{"path": pin.path, "sha256": pin.sha256} for pin in case.inputs]
        if golden.get("inputs") != pinned:
            raise StageFailed(
                f"[{case.id}] golden file {self.golden_path(case)} pins inputs {golden.get('inputs')}, "
                f"but the manifest pins {pinned}"
            )
        return ExplicitFields(tuple(golden["explicit_fields"]), None)

    def outcome(self, case: Case) -> CaseOutcome:
        """Read (or take from golden) and compose a case, once per process."""
        if case.id in self._outcomes:
            return self._outcomes[case.id]
        if case.error:
            raise StageFailed(case.error)
        if case.resolved is not None:
            result = self._resolved_outcome(case)
            self._outcomes[case.id] = result
            return result
        try:
            fields, source = self.read(case), "launch"
        except StageUnavailable:
            fields, source = self.golden_fields(case), "golden"
        assert self.manifest is not None
        composition = self.composer().compose(fields.fields, case.bindings.variables)
        result = CaseOutcome(fields, source, composition)
        self._outcomes[case.id] = result
        return result

    @property
    def profile_name(self) -> str:
        from pytest_verl_compat.compile import DEFAULT_PROFILE

        name = (self.manifest.profile if self.manifest else None) or DEFAULT_PROFILE
        if name.endswith((".yaml", ".yml")) and self.manifest is not None:
            # A profile file is relative to the manifest, like golden_dir.
            return str((self.manifest.path.parent / name).resolve())
        return name

    def compile(self, case: Case) -> Any:
        """Compile stage: the ``CompileReport`` of a composed case, or None when not composed."""
        if case.id not in self._reports:
            from pytest_verl_compat.compile import compile_resolved, load_profile

            outcome = self.outcome(case)
            composition = outcome.composition
            self._reports[case.id] = (
                compile_resolved(
                    composition.resolved,
                    case_id=case.id,
                    profile=load_profile(self.profile_name),
                    explicit_fields=outcome.fields.fields,
                )
                if composition.composed
                else None
            )
        return self._reports[case.id]

    def audit_entry(self, case: Case) -> dict[str, Any]:
        """The case's entry of the audit JSON: machine-independent, so it can be a golden file."""
        outcome = self.outcome(case)
        composition = outcome.composition
        report = self.compile(case)
        return {
            "id": case.id,
            "kind": case.kind,
            "outcome": report.outcome if report else composition.outcome,
            "reason": report.reason if report else composition.reason,
            "inputs": [{"path": pin.path, "sha256": pin.sha256} for pin in case.inputs],
            "explicit_fields": list(outcome.fields.fields),
            "resolved_leaf_count": count_leaves(composition.resolved)
            if composition.composed
            else 0,
            "leaf_classes": report.counts if report else {},
            "findings": [f.to_json() for f in report.findings] if report else [],
        }

    def upstream_verdict(self, case: Case, cache: Any = None) -> dict[str, str]:
        """Upstream validate_config's verdict, computed for every composed case in one subprocess."""
        if self._verdicts is None:
            from pytest_verl_compat.upstream_validate import upstream_verdicts

            composed = [
                c for c in self.cases if not c.error and self.outcome(c).composition.composed
            ]
            mappings = [self.outcome(c).composition.resolved for c in composed]
            try:
                verdicts = upstream_verdicts(mappings, cache)
            except RuntimeError as exc:
                raise StageFailed(str(exc)) from exc
            self._verdicts = {c.id: v for c, v in zip(composed, verdicts, strict=True)}
        return self._verdicts[case.id]

    def reference_config(self, case: Case) -> Any:
        """The reference trainer's typed config for an accepted case (a ``ReferenceTrainerConfig``)."""
        from pytest_verl_compat.lower import reference_config

        report = self.compile(case)
        if report is None:
            raise StageFailed(
                f"[{case.id}] composition rejected: {self.outcome(case).composition.reason}"
            )
        if not report.accepted:
            raise StageFailed(f"[{case.id}] rejected by profile {report.profile}: {report.reason}")
        return reference_config(
            self.outcome(case).composition.resolved,
            case_id=case.id,
            profile=report.profile,
            bindings=tuple(report.bindings),
            lowered=report.lowered,
        )

    def _resolved_outcome(self, case: Case) -> CaseOutcome:
        """A ``resolved`` case: a run's resolved configuration file, checked against the pinned tree."""
        from pytest_verl_compat.resolved import ResolvedFileError, check_resolved, load_resolved
        from pytest_verl_compat.upstream import check_pins

        assert self.manifest is not None and case.resolved is not None
        folder = self.manifest.path.parent
        bad = [check for check in check_pins(folder, case.inputs) if not check.ok]
        if bad:
            raise StageFailed("; ".join(check.message() for check in bad))
        try:
            mapping = load_resolved(folder / case.resolved)
        except ResolvedFileError as exc:
            raise StageFailed(f"[{case.id}] {exc}") from exc
        check = check_resolved(mapping, self.composer(), f"verl {self.manifest.upstream.version}")
        fields = ExplicitFields((), None)
        if not check.from_pinned_tree or check.unresolved:
            reason = "; ".join(check.lines(limit=5))
            return CaseOutcome(
                fields, "resolved", Composition("composition_rejection", reason=reason)
            )
        return CaseOutcome(fields, "resolved", Composition("composed", resolved=mapping))

    def golden_payload(self, case: Case) -> dict[str, Any]:
        """What the compose golden file holds for a case."""
        outcome = self.outcome(case)
        assert outcome.fields is not None and outcome.composition is not None
        composition = outcome.composition
        payload: dict[str, Any] = {
            "case": case.id,
            "inputs": [{"path": pin.path, "sha256": pin.sha256} for pin in case.inputs],
            "explicit_fields": list(outcome.fields.fields),
            "outcome": composition.outcome,
        }
        if composition.composed:
            payload["missing"] = list(composition.missing)
            payload["resolved_leaf_count"] = count_leaves(composition.resolved)
            payload["resolved"] = composition.resolved
        else:
            payload["reason"] = composition.reason
        return payload
