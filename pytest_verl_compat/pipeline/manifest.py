"""Corpus manifest: the cases to audit, their pinned inputs and their environment bindings."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from pytest_verl_compat.files.safe_input import (
    SAFE_CASE_ID,
    BoundedLoader,
    InputError,
    load_yaml,
    read_text,
)
from pytest_verl_compat.model import (
    EXAMPLE,
    Bindings,
    Case,
    InputPin,
    Manifest,
    OverrideBlock,
    UpstreamPin,
)

# Bases a derived case may stand on, one on another: each adds its overrides to every case above
# it, so a long chain costs its length squared in overrides to compose (the corpus needs 1).
MAX_BASE_CHAIN = 32


class ManifestError(Exception):
    """The manifest as a whole cannot be used (unreadable, or its top level is malformed)."""


def embedded_root() -> Path:
    """Folder holding ``corpus/`` and ``golden/``: the wheel's ``_embedded`` or the source tree."""
    packaged = Path(str(resources.files("pytest_verl_compat"))) / "_embedded"
    if (packaged / "corpus").is_dir():
        return packaged
    return Path(__file__).resolve().parents[2]


def default_manifest_path() -> Path:
    return embedded_root() / "corpus" / "manifest.yaml"


def _schema() -> dict[str, Any]:
    text = resources.files("pytest_verl_compat").joinpath("data/manifest.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


class _LineLoader(BoundedLoader):
    """Bounded safe YAML loader that remembers the line of every mapping, for error messages."""


def _construct_mapping_with_line(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping: dict[str, Any] = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_with_line
)


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(v) for v in value]
    return value


def _dotted(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _first_error(
    validator: jsonschema.Validator, instance: Any
) -> jsonschema.ValidationError | None:
    errors = sorted(
        validator.iter_errors(instance), key=lambda e: (list(e.absolute_path), e.message)
    )
    return jsonschema.exceptions.best_match(errors) if errors else None


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest; only an unusable top level raises ``ManifestError``."""
    path = Path(path)
    try:
        text = read_text(path, what="manifest")
    except InputError as exc:
        raise ManifestError(str(exc)) from exc
    return _parsed_manifest(path, text)


@functools.lru_cache(maxsize=16)
def _parsed_manifest(path: Path, text: str) -> Manifest:
    """The manifest of this text at this path (parsed and validated once per process: the
    plugin, the conformance plan and the CLI each ask for it)."""
    try:
        raw_with_lines = load_yaml(text, str(path), _LineLoader)
    except InputError as exc:
        raise ManifestError(str(exc)) from exc
    if not isinstance(raw_with_lines, dict):
        raise ManifestError(f"{path}: expected a mapping at the top level")
    raw = _strip_lines(raw_with_lines)

    schema = _schema()
    # The top level is checked with an unconstrained case list, so that one bad case does
    # not take down the others; each case is then checked on its own below.
    top_schema = {
        **schema,
        "properties": {**schema["properties"], "cases": {"type": "array", "minItems": 1}},
    }
    validator_cls = jsonschema.validators.validator_for(schema)
    error = _first_error(validator_cls(top_schema), raw)
    if error is not None:
        raise ManifestError(f"{path}: field {_dotted(error.absolute_path)}: {error.message}")
    case_validator = validator_cls({**schema["$defs"]["case"], "$defs": schema["$defs"]})

    bindings = Bindings.from_mapping(raw["environment"])
    raw_cases = raw["cases"]
    line_cases = raw_with_lines["cases"]
    # Every safe id seen, valid or not: an id names golden files and test ids, so a later case
    # reusing the id of an invalid one must be flagged too, not silently become the only one.
    first_line: dict[str, int] = {}
    cases: list[Case] = []
    # Cases by id as built so far: a derived case starts from its base's built case, so a long
    # chain of bases costs one step per case (no recursion, nothing rebuilt).
    built: dict[str, Case] = {}
    chain: dict[str, int] = {}  # how many bases stand between a case and its launch
    for index, (raw_case, lined) in enumerate(zip(raw_cases, line_cases, strict=True)):
        line = lined.get("__line__", 0) if isinstance(lined, dict) else 0
        case_id = raw_case.get("id") if isinstance(raw_case, dict) else None
        # An id names golden files and test ids: only a safe one is used even in a message's case.
        safe_id = isinstance(case_id, str) and SAFE_CASE_ID.fullmatch(case_id) is not None
        label = case_id if isinstance(case_id, str) and safe_id else f"cases[{index}]"
        if label in first_line:
            message = (
                f"{path}:{line}: duplicate case id {label!r} "
                f"(first defined at line {first_line[label]})"
            )
            cases.append(
                Case(id=f"{label}#duplicate-{index}", kind="invalid", line=line, error=message)
            )
            continue
        if safe_id:
            first_line[label] = line
        error = _first_error(case_validator, raw_case)
        if error is None and not safe_id:
            message = (
                f"{path}:{line}: case {label}: field {_dotted(['cases', index, 'id'])}: "
                f"{case_id!r} is not a safe id (lowercase segments joined by '/', none starting "
                "with '.', no newline)"
            )
            cases.append(Case(id=label, kind="invalid", line=line, error=message))
            continue
        if error is not None:
            where = _dotted(["cases", index, *error.absolute_path])
            message = f"{path}:{line}: case {label!r}: field {where}: {error.message}"
            cases.append(Case(id=label, kind="invalid", line=line, error=message))
            continue
        assert isinstance(case_id, str)  # the case schema requires it
        base_id = raw_case.get("base")
        chain[case_id] = chain[base_id] + 1 if base_id in chain else 0
        if chain[case_id] > MAX_BASE_CHAIN:
            message = (
                f"{path}:{line}: case {case_id!r}: field base: {base_id!r} ends a chain of "
                f"{chain[case_id]} bases; at most {MAX_BASE_CHAIN} (derive from a case nearer "
                "its launch script)"
            )
            cases.append(Case(id=case_id, kind="invalid", line=line, error=message))
            continue
        case = _build_case(path, raw_case, line, bindings, built)
        built[case_id] = case
        cases.append(case)

    golden = raw.get("golden_dir")
    conformance = raw.get("conformance")
    return Manifest(
        path=path,
        upstream=UpstreamPin(**raw["upstream"]),
        bindings=bindings,
        cases=tuple(cases),
        profile=raw.get("profile"),
        golden_dir=(path.parent / golden).resolve() if golden else None,
        known_divergences=tuple(raw.get("known_divergences", ())),
        conformance=(path.parent / conformance).resolve() if conformance else None,
    )


def _build_case(
    path: Path,
    raw: Mapping[str, Any],
    line: int,
    defaults: Bindings,
    earlier: Mapping[str, Case],
) -> Case:
    """Turn a schema-valid entry into a Case, inheriting launch and inputs from its base."""
    launch = raw.get("launch")
    blocks = tuple(OverrideBlock(**b) for b in raw.get("override_blocks", ()))
    inputs = tuple(InputPin(**i) for i in raw.get("inputs", ()))
    overrides = tuple(raw.get("overrides", ()))
    case_bindings = Bindings.from_mapping(raw.get("environment"))
    base_id = raw.get("base")
    error = None
    if base_id is not None:
        # A derived case is its base's launch plus its own overrides; the base must come first
        # so that a cycle cannot be written.
        base_case = earlier.get(base_id)
        if base_case is None or base_id == raw["id"]:
            error = (
                f"{path}:{line}: case {raw['id']!r}: field base: {base_id!r} is not a case defined "
                "above this one"
            )
        else:
            launch = base_case.launch
            blocks = base_case.override_blocks + blocks
            inputs = base_case.inputs + tuple(i for i in inputs if i not in base_case.inputs)
            overrides = base_case.overrides + overrides
            case_bindings = base_case.bindings.overlay(case_bindings)
    if launch is not None and not any(pin.path == launch for pin in inputs):
        error = error or (
            f"{path}:{line}: case {raw['id']!r}: field inputs: the launch script {launch!r} "
            "has no sha256 pin"
        )
    missing_pins = [b.path for b in blocks if not any(pin.path == b.path for pin in inputs)]
    if missing_pins:
        error = error or (
            f"{path}:{line}: case {raw['id']!r}: field inputs: {missing_pins[0]!r} has no sha256 pin"
        )
    return Case(
        id=raw["id"],
        kind=raw["kind"],
        line=line,
        title=raw.get("title", ""),
        launch=launch,
        base=base_id,
        resolved=raw.get("resolved"),
        overrides=overrides,
        override_blocks=blocks,
        inputs=inputs,
        bindings=defaults.overlay(case_bindings),
        expected=raw.get("expected"),
        upstream=raw.get("upstream"),
        notes=raw.get("notes", ""),
        error=error,
    )


def default_examples_path() -> Path:
    return embedded_root() / "corpus" / "examples.yaml"


def _examples_error(path: Path, where: str, message: str) -> ManifestError:
    return ManifestError(f"{path}: {where}: {message}")


def load_examples(path: str | Path, base: Bindings) -> tuple[Case, ...]:
    """Upstream's own launch scripts as ``example`` cases, read with ``base`` plus their bindings.

    Each entry pins one script by sha256; ``environment`` (only where the read needs it) overlays
    ``base``; ``read_error`` is the expected reason a script yields no launcher argv.
    """
    path = Path(path)
    try:
        raw = load_yaml(read_text(path, what="examples list"), str(path))
    except InputError as exc:
        raise ManifestError(str(exc)) from exc
    scripts = raw.get("scripts") if isinstance(raw, dict) else None
    if not isinstance(scripts, list) or not scripts:
        raise _examples_error(path, "field scripts", "expected a non-empty list")
    cases: list[Case] = []
    seen: set[str] = set()
    for index, entry in enumerate(scripts):
        where = f"field scripts[{index}]"
        if not isinstance(entry, dict):
            raise _examples_error(path, where, "expected a mapping")
        script, sha = entry.get("path"), entry.get("sha256")
        if not isinstance(script, str) or not script.endswith(".sh"):
            raise _examples_error(path, f"{where}.path", "expected a path to a .sh file")
        if not isinstance(sha, str) or len(sha) != 64:
            raise _examples_error(path, f"{where}.sha256", "expected a sha256 hex digest")
        case_id = script[: -len(".sh")]
        if case_id in seen:
            raise _examples_error(path, f"{where}.path", f"duplicate script {script!r}")
        seen.add(case_id)
        read_error = entry.get("read_error")
        cases.append(
            Case(
                id=case_id,
                kind=EXAMPLE,
                line=0,
                launch=script,
                inputs=(InputPin(script, sha),),
                bindings=base.overlay(Bindings.from_mapping(entry.get("environment"))),
                expected={"read_error": read_error} if read_error else None,
            )
        )
    return tuple(cases)
