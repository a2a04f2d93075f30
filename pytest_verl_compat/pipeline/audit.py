"""The audit session: options, the manifest, the upstream tree, and per-case results cached per process.

Every front end (the pytest stages, the CLI, the trainer command) goes through one session, so a
case is read, composed and compiled the same way everywhere, and only an accepted compile report
lowers to the reference trainer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.checks.model_facts import ModelFacts
from pytest_verl_compat.checks.registry import RL, SFT, family_of
from pytest_verl_compat.files.digests import sha256_file
from pytest_verl_compat.files.safe_input import InputError, confined
from pytest_verl_compat.model import (
    SCRIPT,
    SEMANTIC_REJECTION,
    Bindings,
    Case,
    CompileReport,
    Composition,
    ExplicitFields,
    FieldsSource,
    InputPin,
    Manifest,
    StageFailed,
    StageUnavailable,
    UpstreamPin,
)
from pytest_verl_compat.pipeline.compile import compile_resolved
from pytest_verl_compat.pipeline.compose import Composer, count_leaves
from pytest_verl_compat.pipeline.entry_points import (
    PINNED_ENTRY_MODULE,
    SFT_CONFIG_NAME,
    SFT_ENTRY_MODULE,
    EntryPoint,
    UnknownEntryPoint,
    by_module,
    closest,
)
from pytest_verl_compat.pipeline.entry_registry import ReleaseModules, release_modules
from pytest_verl_compat.pipeline.lower import NotAccepted, reference_config
from pytest_verl_compat.pipeline.manifest import (
    ManifestError,
    default_manifest_path,
    embedded_root,
    load_manifest,
)
from pytest_verl_compat.pipeline.memo import COMPILE as COMPILE_KIND
from pytest_verl_compat.pipeline.memo import COMPOSITION as COMPOSITION_KIND
from pytest_verl_compat.pipeline.memo import TREE as TREE_KIND
from pytest_verl_compat.pipeline.memo import (
    StageMemo,
    composition_from_json,
    composition_json,
    report_from_json,
    report_json,
)
from pytest_verl_compat.pipeline.model_facts import local_model_facts
from pytest_verl_compat.pipeline.pins import (
    PinMismatch,
    UpstreamError,
    UpstreamTree,
    check_pins,
    locate_upstream,
    release_files_tree,
    with_release_tree,
)
from pytest_verl_compat.pipeline.profile import (
    Profile,
    default_profile,
    default_sft_profile,
    load_profile,
    profile_sha256,
)
from pytest_verl_compat.pipeline.resolved import (
    ResolvedFileError,
    load_run,
    resolved_case,
    resolved_composition,
)
from pytest_verl_compat.pipeline.snapshot import read_golden
from pytest_verl_compat.releases.choice import ReleaseChoice, choose_release
from pytest_verl_compat.releases.index import ReleaseError
from pytest_verl_compat.releases.wheels import ReleaseTree, release_tree
from reference_trainer.config import ReferenceTrainerConfig

# The folder of a golden folder that holds each other release's golden files than the manifest's.
RELEASES_GOLDEN = "releases"
# The golden file's record of a launch of another entry point than the pinned one.
LAUNCH_KEY = "launch"
# A user's own script is read from its absolute path, so its pins are checked from the root.
_FILESYSTEM_ROOT = Path("/")

if TYPE_CHECKING:
    from pytest_verl_compat.bash import Way


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
    # The release to check, as the user chose it (``--release``, a setting), and where that
    # choice was made (``releases.choice``); None: chosen by the tree, the installed verl or
    # the manifest.
    release: str | None = None
    release_source: str = ""


@dataclass(frozen=True)
class CaseOutcome:
    """Where a case ended up after reading and composing."""

    fields: ExplicitFields
    fields_source: FieldsSource
    composition: Composition
    error: str = ""


@dataclass
class AuditSession:
    """Everything the stage tests share; built once per process from the options."""

    options: AuditOptions
    # Caches and the manifest's cases stay out of the repr: pytest prints a failing stage test's
    # arguments, and the whole session's repr took ~1.7 s per failure (measured, 132 cases).
    manifest: Manifest | None = field(default=None, repr=False)
    manifest_error: str = ""
    upstream: UpstreamTree | None = None
    upstream_reason: str = ""
    # The release checked (``releases.choice``), or why none could be (``release_error``).
    release: ReleaseChoice | None = None
    release_error: str = ""
    _release_files: ReleaseTree | None = field(default=None, repr=False)
    _release_modules: ReleaseModules | None = field(default=None, repr=False)
    golden_dir: Path = Path("golden")
    # The golden folder's top: the manifest's own release's files, whose snapshots also hold
    # each case's explicit fields (a script reads the same for every release).
    corpus_golden_dir: Path = Path("golden")
    _outcomes: dict[str, CaseOutcome] = field(default_factory=dict, repr=False)
    _composer: Composer | None = field(default=None, repr=False)
    _entry_composers: dict[tuple[str, str], Composer] = field(default_factory=dict, repr=False)
    _reports: dict[str, CompileReport | None] = field(default_factory=dict, repr=False)
    # ``check --model-config``: the actor model's facts, instead of its path's config.json.
    model_facts_override: ModelFacts | None = field(default=None, repr=False)
    _model_facts: dict[str, dict[str, ModelFacts]] = field(default_factory=dict, repr=False)
    # The stages' results kept between runs (``memo``), and each case's keys there.
    memo: StageMemo = field(default_factory=StageMemo, repr=False)
    _memo_keys: dict[str, str] = field(default_factory=dict, repr=False)
    _profile_digests: dict[str, str] = field(default_factory=dict, repr=False)
    # A resolved file's case: the world its launch started (``compile --world-size``), by case id.
    _resolved_worlds: dict[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, options: AuditOptions) -> AuditSession:
        session = cls(options)
        root = embedded_root()
        rootdir = Path(options.rootdir)
        manifest_path = Path(options.manifest) if options.manifest else default_manifest_path()
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
        session.corpus_golden_dir = session.golden_dir
        try:
            session.upstream, session.upstream_reason = locate_upstream(
                session.manifest.upstream,
                option=options.upstream,
                ini=options.upstream_ini,
                rootdir=rootdir,
            )
        except UpstreamError as exc:
            # A folder given that is no upstream: said as it is, never replaced by another tree.
            session.upstream_reason = str(exc)
            session._choose_release(refused=True)
            return session
        session._choose_release()
        return session

    def _choose_release(self, *, refused: bool = False) -> None:
        """The release checked, and its own config tree where the folder given is not its
        (``refused``: the folder given is not an upstream folder; the session has no tree)."""
        assert self.manifest is not None
        given = self.upstream
        try:
            # A release_source says the value is a setting's (a file, an ini key), not a flag's.
            setting = self.options.release_source
            self.release = choose_release(
                option=None if setting else self.options.release,
                setting=self.options.release if setting else None,
                setting_source=setting,
                tree_version=given.version if given is not None else None,
                manifest_version=self.manifest.upstream.version,
            )
        except ReleaseError as exc:
            self.release_error = str(exc)
            self.upstream, self.upstream_reason = None, str(exc)
            return
        version = self.release.version
        if version != self.manifest.upstream.version:
            # The manifest's own release keeps the golden folder's top; each other release has
            # its own golden files (snapshots, recorded answers) beneath it, and its own
            # expectations where the manifest says it judges a case otherwise.
            self.golden_dir = self.golden_dir / RELEASES_GOLDEN / version
            self.manifest = dataclasses.replace(
                self.manifest, cases=tuple(case.in_release(version) for case in self.manifest.cases)
            )
        if refused or (given is not None and given.version in (None, version)):
            # Its own tree, or a tree of no release: composed as it is (upstream's code never
            # sees a tree of no release, ``early.upstream_gate``).
            return
        try:
            files = self.release_files()
        except StageUnavailable as exc:
            self.upstream, self.upstream_reason = None, str(exc)
            return
        pin = self.pin
        self.upstream = (
            release_files_tree(files, pin)
            if given is None
            else with_release_tree(given, files, pin)
        )

    @property
    def pin(self) -> UpstreamPin:
        """The checked release's pin (asked only once the manifest has loaded): the manifest's
        own, or another release's from the release index."""
        assert self.manifest is not None, self.manifest_error
        base = self.manifest.upstream
        if self.release is None or self.release.version == base.version:
            return base
        release = self.release.release
        return dataclasses.replace(
            base,
            tag=release.tag,
            commit=release.commit,
            version=release.version,
            tree_sha256=release.tree_sha256,
        )

    @property
    def version(self) -> str:
        """The version of the release checked, as every output names it."""
        return self.pin.version

    def release_modules(self) -> ReleaseModules | None:
        """The checked release's entry points and module names (``entry_registry``)."""
        if self.release is not None and self._release_modules is None:
            self._release_modules = release_modules(self.release.version, self._release_root)
        return self._release_modules

    def _release_root(self) -> Path | None:
        try:
            return self.release_files().root
        except StageUnavailable:
            return None

    def release_files(self) -> ReleaseTree:
        """The checked release's own files (its source and tree), fetched on first use."""
        if self.release is None:
            raise StageUnavailable(self.release_error or "no release chosen")
        if self._release_files is None:
            try:
                self._release_files = release_tree(self.release.version)
            except ReleaseError as exc:
                raise StageUnavailable(str(exc)) from exc
        return self._release_files

    @property
    def cases(self) -> tuple[Case, ...]:
        return self.manifest.cases if self.manifest else ()

    def composer(self, fields: ExplicitFields | None = None) -> Composer:
        """The composer of the config the fields' entry point composes (the pinned one's when
        the launch runs the pinned entry point, or says nothing of it)."""
        if self.upstream is None:
            raise StageUnavailable(f"no upstream config tree: {self.upstream_reason}")
        assert self.manifest is not None
        entry = self.entry_point(fields)
        if entry is not None and not self._is_pinned(entry):
            return self._entry_composer(entry)
        if self._composer is None:
            self._composer = Composer(self.upstream.config_dir, self.manifest.upstream.config_name)
        return self._composer

    def entry_points(self) -> tuple[EntryPoint, ...]:
        """The checked release's entry points, from its own source (none known without it)."""
        modules = self.release_modules()
        return modules.entries if modules is not None else ()

    def entry_point(self, fields: ExplicitFields | None) -> EntryPoint | None:
        """The entry point the fields' launch runs; None for the pinned one, or a launch that
        names none. A module the release does not have is the read stage's failure."""
        module = fields.module if fields is not None else None
        if not module or module == PINNED_ENTRY_MODULE:
            return None
        known = by_module(self.entry_points())
        if module in known:
            return known[module]
        assert self.manifest is not None
        if not known:
            raise StageUnavailable(
                f"{module}: the entry points of verl {self.pin.version} are read from its own "
                f"files, and they are not here ({self.release_error or 'not fetched'})"
            )
        unknown = UnknownEntryPoint(
            module, self.pin.version, closest(module, tuple(known.values()))
        )
        raise StageFailed(str(unknown)) from unknown

    def launches_sft(self, case: Case) -> bool:
        """Whether the case launches an entry point of the SFT trainer's tree (its read fields'
        entry point; nothing composed): the RL reference trainer and step stage never train it."""
        try:
            entry = self.entry_point(self.read_fields(case))
        except (StageFailed, StageUnavailable):
            return False  # not read here: the stages that read it say why
        return entry is not None and entry.config_name == SFT_CONFIG_NAME

    def _is_pinned(self, entry: EntryPoint) -> bool:
        assert self.manifest is not None
        return entry.config_dir == self.pin.config_dir and entry.config_name == self.pin.config_name

    def _entry_composer(self, entry: EntryPoint) -> Composer:
        """A composer of the entry point's config: its folder of the pinned tree when it is that
        tree's, else of the installed release (with the folders its search path adds)."""
        assert self.upstream is not None
        key = (entry.config_dir, entry.config_name)
        if key not in self._entry_composers:
            pinned = self.upstream.config_dir

            def folder(relative: str) -> Path:  # the release's files only for another tree
                if relative == self.pin.config_dir:
                    return pinned
                return self.release_files().root / relative

            self._entry_composers[key] = Composer(
                folder(entry.config_dir),
                entry.config_name,
                search_path=tuple(folder(extra) for extra in entry.search_path),
            )
        return self._entry_composers[key]

    def read(self, case: Case) -> ExplicitFields:
        """Read stage: needs a checkout with the launch scripts."""
        if case.error:
            raise StageFailed(case.error)
        if self.upstream is None or not (
            self.upstream.has_scripts or self._inputs_present(case, self.upstream.root)
        ):
            where = (
                "no upstream"
                if self.upstream is None
                else f"the {self.upstream.kind} at {self.upstream.root}"
            )
            assert self.manifest is not None
            raise StageUnavailable(
                f"{where} has no launch scripts; explicit fields come from the golden snapshot "
                f"{self.golden_path(case)} (pinned by the inputs' sha256). For the read stage, pass "
                f"--verl-corpus-upstream PATH to a verl v{self.manifest.upstream.version} checkout"
            )
        return self._read_from(case, self.upstream.root, label=f"[{case.id}] ")

    @staticmethod
    def _inputs_present(case: Case, root: Path) -> bool:
        # A folder of the user's own scripts needs no examples/ to be read: its cases' inputs are there.
        return bool(case.inputs) and all((root / pin.path).is_file() for pin in case.inputs)

    def with_overrides(
        self, case: Case, overrides: tuple[str, ...], *, case_id: str | None = None
    ) -> Case:
        """``case`` plus extra overrides, its fields read (or taken from golden) as ``case``'s are;
        the new case is ``case_id`` (default ``<id>+set``), composed and compiled once."""
        if not overrides:
            return case
        if case.resolved is not None:
            raise StageFailed(f"[{case.id}] a resolved configuration takes no extra overrides")
        base = self.outcome(case)
        extended = dataclasses.replace(
            case, id=case_id or f"{case.id}+set", overrides=case.overrides + overrides
        )
        # The same launch (entry point, world), its override list extended.
        fields = dataclasses.replace(base.fields, fields=base.fields.fields + overrides)
        composition = self._compose(extended.id, fields, case.bindings)
        self._outcomes[extended.id] = CaseOutcome(fields, base.fields_source, composition)
        # A case composed again with other overrides is compiled again.
        self._reports.pop(extended.id, None)
        self._model_facts.pop(extended.id, None)
        return extended

    def golden_path(self, case: Case, folder: Path | None = None) -> Path:
        # The id is checked when the manifest loads; confined() keeps that a guarantee here.
        return confined((folder or self.golden_dir) / "compose", f"{case.id}.json")

    def golden_fields(self, case: Case) -> ExplicitFields:
        """Explicit fields recorded in the golden snapshot of the manifest's own release (a
        script reads the same whatever the release checked), only if it pins the same inputs."""
        try:
            golden = read_golden(self.corpus_golden_dir, "compose", case.id)
        except InputError as exc:
            raise StageFailed(f"[{case.id}] {exc}") from exc
        if golden is None:
            raise StageFailed(
                f"[{case.id}] no launch scripts here and no golden file "
                f"{self.golden_path(case, self.corpus_golden_dir)}"
            )
        pinned = case.pinned_inputs()
        if golden.get("inputs") != pinned:
            raise StageFailed(
                f"[{case.id}] golden file {self.golden_path(case, self.corpus_golden_dir)} pins "
                f"inputs {golden.get('inputs')}, "
                f"but the manifest pins {pinned}"
            )
        recorded = golden.get(LAUNCH_KEY)
        launch: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        return ExplicitFields(
            tuple(golden["explicit_fields"]),
            None,
            module=launch.get("module"),
            world_size=launch.get("world_size"),
            world_size_reason=str(launch.get("world_size_reason", "")),
            launcher=launch.get("launcher"),
        )

    def read_fields(self, case: Case) -> ExplicitFields:
        """A case's explicit fields as its outcome reads them (the script, else golden)."""
        if case.kind == SCRIPT:
            return self._read_from(case, _FILESYSTEM_ROOT)
        try:
            return self.read(case)
        except StageUnavailable:
            return self.golden_fields(case)

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
        source: FieldsSource
        if case.kind == SCRIPT:
            fields, source = self._read_from(case, _FILESYSTEM_ROOT), "launch"
        else:
            try:
                fields, source = self.read(case), "launch"
            except StageUnavailable:
                fields, source = self.golden_fields(case), "golden"
        composition = self._compose(case.id, fields, case.bindings)
        result = CaseOutcome(fields, source, composition)
        self._outcomes[case.id] = result
        return result

    def _compose(self, case_id: str, fields: ExplicitFields, bindings: Bindings) -> Composition:
        """The fields composed on the tree, or the composition kept for the same tree, fields
        and environment (``memo``)."""
        composer = self.composer(fields)
        variables = dict(fields.environment(bindings))
        key = self.memo.key(
            COMPOSITION_KIND,
            {
                "tree": composer.check_tree(),
                "config": composer.config_name,
                "fields": list(fields.fields),
                "variables": sorted(variables.items()),
            },
        )
        self._memo_keys[case_id] = key
        kept = self.memo.get(COMPOSITION_KIND, key)
        if kept is not None:
            return composition_from_json(kept)
        composition = composer.compose(fields.fields, variables)
        plain = composition_json(composition)
        if plain is not None:
            self.memo.put(COMPOSITION_KIND, key, plain)
        return composition

    def compose_variant(self, fields: ExplicitFields, bindings: Bindings) -> Composition:
        """``fields`` composed as a case's are, not kept: a variant of a case's launch asked about
        once (``upstream.verdict.blame`` leaves some of its keys out)."""
        return self.composer(fields).compose(fields.fields, dict(fields.environment(bindings)))

    def memo_key(self, case: Case) -> str | None:
        """The key of the case's composition in the memo (None for a resolved file's case)."""
        self.outcome(case)
        return self._memo_keys.get(case.id)

    def generated_difference(self, generated: Path) -> str | None:
        """Where the override-free composition differs from upstream's generated reference of
        the tree (its ``_generated_*.yaml``), or None; kept for the same tree (``memo``)."""
        composer = self.composer()
        key = self.memo.key(
            TREE_KIND,
            {
                "tree": composer.check_tree(),
                "config": composer.config_name,
                "generated": sha256_file(generated, "generated reference"),
            },
        )
        kept = self.memo.get(TREE_KIND, key)
        if isinstance(kept, dict):
            return kept.get("difference")
        difference = composer.generated_difference(generated)
        self.memo.put(TREE_KIND, key, {"difference": difference})
        return difference

    def case_for_script(self, script: str | Path, extra: Bindings | None = None) -> Case:
        """A one-off case for a launch script path, read with the manifest's bindings plus ``extra``.

        Every command that takes a script goes through this case and the session's stages, so
        such a script is read, composed and compiled exactly as a manifest case is.
        """
        assert self.manifest is not None
        path = Path(script).resolve()
        return Case(
            id=path.stem,
            kind=SCRIPT,
            line=0,
            launch=str(path),
            inputs=(InputPin(str(path), sha256_file(path)),),
            bindings=self.manifest.bindings.overlay(extra or Bindings()),
        )

    def case_for_resolved(self, given: str | Path, world_size: int | None = None) -> Case:
        """A one-off case for a run's resolved file (or its run folder), and Hydra's
        ``overrides.yaml`` beside it: composed, compiled and checked as a manifest case is, so
        ``compile RESOLVED`` and ``check`` keep one rule set. ``world_size``: the processes its
        launcher started (torchrun's), which no resolved file records."""
        assert self.manifest is not None
        try:
            case = resolved_case(Path(given), self.manifest.bindings)
        except ResolvedFileError as exc:
            raise StageFailed(str(exc)) from exc
        if world_size is not None:
            self._resolved_worlds[case.id] = world_size
        return case

    def case_ways(self, case: Case) -> list[tuple[Way, Case]]:
        """A script case split at the conditions only the running system decides whose ways
        part (``pipeline.read.case_ways``)."""
        from pytest_verl_compat.pipeline.read import case_ways

        root = _FILESYSTEM_ROOT if case.kind == SCRIPT else self.upstream_root()
        return case_ways(case, root, self.release_modules())

    def upstream_root(self) -> Path:
        """The folder a manifest case's launch script is relative to."""
        if self.upstream is None:
            raise StageUnavailable("no upstream checkout with the launch scripts")
        return self.upstream.root

    def _read_from(self, case: Case, root: Path, label: str = "") -> ExplicitFields:
        """The input's errors (unreadable script, pin mismatch) fail the stage; bugs propagate.
        The launch reader is imported here: a run from golden fields never needs it."""
        from pytest_verl_compat.bash import LaunchReadError
        from pytest_verl_compat.pipeline.read import read_case_fields

        try:
            return read_case_fields(case, root, self.release_modules())
        except (LaunchReadError, PinMismatch, InputError, OSError) as exc:
            raise StageFailed(f"{label}{exc}") from exc

    @property
    def profile_name(self) -> str:
        name = (self.manifest.profile if self.manifest else None) or self.release_profile(RL)
        if name.endswith((".yaml", ".yml")) and self.manifest is not None:
            # A profile file is relative to the manifest, like golden_dir.
            return str((self.manifest.path.parent / name).resolve())
        return name

    def release_profile(self, family: str) -> str:
        """The checked release's own profile of a family's tree (the release index names it):
        never another release's in its place."""
        release = self.release.release if self.release is not None else None
        if release is not None:
            name = release.profile if family == RL else release.sft_profile
            if not name:
                key = "profile" if family == RL else "sft_profile"
                raise StageUnavailable(
                    f"verl {release.version} names no {key} in releases.yaml (`verl-compat "
                    f"release derive {release.version}` writes one to review)"
                )
            return name
        return default_profile() if family == RL else default_sft_profile()

    def model_facts(self, case: Case) -> dict[str, ModelFacts]:
        """The facts of the case's models that are local folders (or the --model-config override)."""
        if case.id not in self._model_facts:
            composition = self.outcome(case).composition
            self._model_facts[case.id] = (
                local_model_facts(composition.mapping, self.model_facts_override)
                if composition.composed
                else {}
            )
        return self._model_facts[case.id]

    def compile(self, case: Case) -> CompileReport | None:
        """Compile stage: the ``CompileReport`` of a composed case, or None when not composed."""
        if case.id not in self._reports:
            outcome = self.outcome(case)
            composition = outcome.composition
            self._reports[case.id] = self._compile(case, outcome) if composition.composed else None
        return self._reports[case.id]

    def _compile(self, case: Case, outcome: CaseOutcome) -> CompileReport:
        """The report of a composed case, or the one kept for the same composition, profile and
        model facts (``memo``). The profile and the checks are those of the tree's family: an
        RL trainer's tree (the manifest's profile), the SFT trainer's (the SFT profile)."""
        mapping = outcome.composition.mapping
        family = family_of(mapping)
        entry = self.entry_point(outcome.fields)
        if family is None or (entry is not None and not entry.trains_at):
            return self._without_profile(case, outcome.fields)
        profile_name = self.profile_name if family == RL else self.release_profile(SFT)
        facts = self.model_facts(case)
        composed = self._memo_keys.get(case.id)
        key = None
        if composed is not None:
            key = self.memo.key(
                COMPILE_KIND,
                {
                    "composition": composed,
                    "case": case.id,
                    "profile": self._profile_sha256(profile_name),
                    "launch": [
                        outcome.fields.world_size,
                        outcome.fields.launcher,
                        entry.world if entry is not None else None,
                        entry.module if entry is not None else None,
                    ],
                    "model_facts": {
                        role: dataclasses.asdict(fact) for role, fact in sorted(facts.items())
                    },
                },
            )
            self._memo_keys[f"{case.id}\0compile"] = key
            kept = self.memo.get(COMPILE_KIND, key)
            if kept is not None:
                return report_from_json(kept)
        report = compile_resolved(
            mapping,
            case_id=case.id,
            profile=load_profile(profile_name),
            explicit_fields=outcome.fields.fields,
            model_facts=facts,
            defaults=self.composer(outcome.fields).defaults(outcome.fields.fields),
            family=family,
            world_size=outcome.fields.world_size,
            launcher=outcome.fields.launcher,
            world_source=entry.world if entry is not None else None,
            forced=entry.forced if entry is not None else (),
            entry_calls=entry.calls if entry is not None else frozenset(),
            entry_module=entry.module if entry is not None else None,
        )
        plain = report_json(report) if key is not None else None
        if key is not None and plain is not None:
            self.memo.put(COMPILE_KIND, key, plain)
        return report

    def _without_profile(self, case: Case, fields: ExplicitFields) -> CompileReport:
        """A composed tree of no family the reference trainer trains (verl's evaluation), or of
        an entry point that never trains (it serves or scores a model): no leaf classified, no
        training check, the case not runnable, with why."""
        entry = self.entry_point(fields)
        what = f"{entry.module} ({entry.config_name})" if entry is not None else "this config"
        reason = (
            f"the reference trainer has no counterpart of {what}: no profile classifies its tree"
        )
        if entry is not None and not entry.trains_at:
            reason = (
                f"{entry.module} never trains (no trainer's fit is reached from {entry.file}): "
                "the training checks and the reference trainer do not apply to its tree"
            )
        return CompileReport(case.id, "none", SEMANTIC_REJECTION, reason, (), ())

    def compile_key(self, case: Case) -> str | None:
        """The key of the case's compile report in the memo, once compiled (None: not kept)."""
        self.compile(case)
        return self._memo_keys.get(f"{case.id}\0compile")

    def _profile(self) -> Profile:
        return load_profile(self.profile_name)

    def _profile_sha256(self, name: str) -> str:
        """A profile file's sha256, without parsing it (a kept report needs no profile)."""
        if name not in self._profile_digests:
            self._profile_digests[name] = profile_sha256(name)
        return self._profile_digests[name]

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
            "inputs": case.pinned_inputs(),
            "explicit_fields": list(outcome.fields.fields),
            "resolved_leaf_count": count_leaves(composition.resolved)
            if composition.composed
            else 0,
            "leaf_classes": report.counts if report else {},
            "findings": [f.to_json() for f in report.findings] if report else [],
        }

    def reference_config(self, case: Case) -> ReferenceTrainerConfig:
        """The reference trainer's typed config: only from an accepted compile report (the gate)."""
        report = self.compile(case)
        if report is None:
            raise StageFailed(
                f"[{case.id}] composition rejected: {self.outcome(case).composition.reason}"
            )
        mapping = self.outcome(case).composition.mapping
        if family_of(mapping) == SFT:
            raise StageFailed(
                f"[{case.id}] the SFT trainer's tree: the SFT reference trainer lowers it "
                "(pipeline.sft.sft_config), not the RL one"
            )
        try:
            return reference_config(mapping, report)
        except NotAccepted as exc:
            raise StageFailed(str(exc)) from exc

    def _resolved_outcome(self, case: Case) -> CaseOutcome:
        """A ``resolved`` case: a run's resolved configuration file, checked against the tree of
        its family (main_ppo's, or the SFT trainer's for an SFT run's file) as a composition is."""
        assert self.manifest is not None and case.resolved is not None
        folder = self.manifest.path.parent
        bad = [check for check in check_pins(folder, case.inputs) if not check.ok]
        if bad:
            raise StageFailed("; ".join(check.message() for check in bad))
        try:
            run = load_run(folder / case.resolved)
        except ResolvedFileError as exc:
            raise StageFailed(f"[{case.id}] {exc}") from exc
        launch = ExplicitFields(
            (),
            None,
            module=SFT_ENTRY_MODULE if family_of(run.mapping) == SFT else None,
            world_size=self._resolved_worlds.get(case.id),
        )
        fields, composition = resolved_composition(
            run, self.composer(launch), f"verl {self.version}", launch
        )
        return CaseOutcome(fields, "resolved", composition)

    def golden_payload(self, case: Case) -> dict[str, Any]:
        """What the compose golden file holds for a case."""
        outcome = self.outcome(case)
        composition = outcome.composition
        payload: dict[str, Any] = {
            "case": case.id,
            "inputs": case.pinned_inputs(),
            "explicit_fields": list(outcome.fields.fields),
            "outcome": composition.outcome,
        }
        fields = outcome.fields
        if self.entry_point(fields) is not None:
            # Another entry point than the pinned one: which, and the world its launcher starts,
            # so that a run from this golden file composes and checks it as the script does.
            payload[LAUNCH_KEY] = {
                "module": fields.module,
                "launcher": fields.launcher,
                "world_size": fields.world_size,
                "world_size_reason": fields.world_size_reason,
            }
        if composition.composed:
            payload["missing"] = list(composition.missing)
            payload["resolved_leaf_count"] = count_leaves(composition.resolved)
            payload["resolved"] = composition.resolved
        else:
            payload["reason"] = composition.reason
        return payload
