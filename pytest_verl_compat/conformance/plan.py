"""The conformance stage's case plan: which comparisons run, with which tolerances.

Kept free of torch and verl so that collecting the stage's test ids costs milliseconds; the
comparisons themselves live in the package's other modules (`inputs`, `components`, `run`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import load_yaml_file
from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest

COMPONENTS = (
    "advantage",
    "policy_loss",
    "agg_loss",
    "kl",
    "kl_in_reward",
    "value_loss",
    "entropy",
    "log_prob",
    "microbatch",
    "sft_loss",
)
DTYPE_NAMES = ("float32", "float64")
AGG_MODE_NAMES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_PENALTY_NAMES = (
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "k1+",
    "k3+",
    "kl+",
    "low_var_kl+",
    "abs+",
)


# The clip bounds of the policy-loss cases (sides.py passes them to both sides).
CLIP = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
# The policy-loss families that end in DUAL_CLIP_FAMILY train every bound off verl's defaults
# and a dual-clip bound that the inputs' ratios (log-ratio ~ N(0, 0.7)) pass on about a sixth of
# the negative-advantage tokens: a loss that left clip_ratio_c at 3.0 computes another value.
DUAL_CLIP_FAMILY = "-dual-clip"
DUAL_CLIP = {
    "clip_ratio": 0.13,
    "clip_ratio_low": 0.11,
    "clip_ratio_high": 0.17,
    "clip_ratio_c": 1.45,
}


def clip_settings(family: str) -> dict[str, float]:
    """The clip bounds of a policy-loss case, by its family."""
    return dict(DUAL_CLIP if family.endswith(DUAL_CLIP_FAMILY) else CLIP)


# verl's V1 losses on unpadded batches (`verl/workers/utils/losses.py` `ppo_loss`, `value_loss`):
# jagged nested inputs, each micro-batch padded only inside the loss to its own longest
# response. `nested-global` leaves `loss_scale_factor` unset (Dr. GRPO's divisor is then that
# width), `nested-scaled` sets it; both with a mini-batch's global normalisers.
NESTED_SCENARIOS = ("nested-global", "nested-scaled")

# verl's SFT loss (`conformance.sft`): the layouts its FSDP engine hands it, the scenarios of
# each, and the data-parallel sizes a batch is split over into micro-batches.
SFT_LAYOUTS = ("nested", "remove-padding", "padded")
SFT_SCENARIOS = ("local", "global", "multiturn")
SFT_DP_SIZES = (1, 2, 4)

# The hyperparameters an advantage estimator may take (their values: `components`).
HYPERPARAMETER_NAMES = ("gamma", "lam")


@dataclass(frozen=True)
class EstimatorSpec:
    """What the conformance cases of one advantage estimator need, keyed by its registry name.

    Ours is `reference_trainer.math.advantages.ADVANTAGE_ESTIMATORS[name]`, upstream's
    `core_algos.get_adv_estimator_fn(name)`. Both are called
    `fn(token_level_rewards, [values,] response_mask, [index,] **keywords)`.
    """

    families: tuple[str, ...]  # input families, in case order (`no-std-` ones need `std_switch`)
    values: bool = False  # critic values, between the rewards and the mask (GAE)
    index: bool = False  # one group id per row, after the mask (group baselines)
    # Token-level rewards too, not only an outcome score on the last token.
    dense_rewards: bool = False
    # `norm_adv_by_std_in_grpo=`, False in the `no-std-` families (Dr. GRPO).
    std_switch: bool = False
    hyperparameters: tuple[str, ...] = ()  # of HYPERPARAMETER_NAMES, passed by keyword
    # Upstream reads the hyperparameters from `config=AlgoConfig(...)`, not from keywords.
    upstream_config: bool = False


# One entry per estimator of `reference_trainer.math.advantages.ADVANTAGE_ESTIMATORS`, under
# its registry name (the advantage cases fail while the two disagree); its cases come from it.
# Families name the scenarios of `inputs`: ragged rows, multiturn (observation spans inside
# responses), empty rows, long rows, groups (mixed group sizes, all-equal groups); `no-std-`
# runs the scenario after it with `norm_adv_by_std_in_grpo=False`.
ESTIMATORS: dict[str, EstimatorSpec] = {
    "gae": EstimatorSpec(
        families=("ragged", "multiturn", "empty", "long"),
        values=True,
        dense_rewards=True,
        hyperparameters=("gamma", "lam"),
    ),
    "grpo": EstimatorSpec(
        families=("ragged", "groups", "empty", "long", "no-std-ragged", "no-std-groups"),
        index=True,
        std_switch=True,
    ),
    "rloo": EstimatorSpec(families=("ragged", "groups", "empty"), index=True),
    "reinforce_plus_plus": EstimatorSpec(
        families=("ragged", "multiturn", "empty", "long"),
        dense_rewards=True,
        hyperparameters=("gamma",),
        upstream_config=True,
    ),
    "reinforce_plus_plus_baseline": EstimatorSpec(
        families=("ragged", "groups", "empty"), index=True
    ),
}


@dataclass(frozen=True)
class ConformanceCase:
    """One comparison: a component's variant on one family of inputs in one dtype."""

    id: str
    component: str
    variant: str
    family: str
    dtype: str
    rtol: float
    atol: float
    samples: int = 3
    # verl computes clip fractions in float32 whatever the input dtype (`.float()`).
    fraction_rtol: float = 1e-5
    fraction_atol: float = 1e-6
    divergence: str = ""  # the reason of a known divergence that loosened this case's tolerance


@dataclass(frozen=True)
class ConformanceResult:
    """One case's verdict: its largest errors over all samples and, on failure, why."""

    case_id: str
    component: str
    variant: str
    samples: int
    max_abs_err: float
    max_grad_abs_err: float
    passed: bool
    message: str


# --------------------------------------------------------------------------- tolerances


def load_tolerances(path: str | Path) -> dict[str, Any]:
    """Read and check `corpus/conformance.yaml`: per component and dtype rtol/atol, samples."""
    data = load_yaml_file(path, what="tolerance file")  # InputError (a ValueError) names it
    if not isinstance(data, dict) or not isinstance(data.get("tolerances"), dict):
        raise ValueError(f"{path}: expected a mapping with a 'tolerances' mapping")
    tolerances = data["tolerances"]
    missing = [c for c in COMPONENTS if c not in tolerances]
    unknown = sorted(set(tolerances) - set(COMPONENTS))
    if missing or unknown:
        raise ValueError(f"{path}: components missing {missing}, unknown {unknown}")
    for component, per_dtype in tolerances.items():
        for dtype in DTYPE_NAMES:
            entry = (per_dtype or {}).get(dtype)
            if not isinstance(entry, dict) or set(entry) != {"rtol", "atol"}:
                raise ValueError(
                    f"{path}: tolerances.{component}.{dtype} needs exactly rtol and atol"
                )
        if per_dtype["float64"]["rtol"] > 1e-10:
            raise ValueError(
                f"{path}: tolerances.{component}.float64.rtol={per_dtype['float64']['rtol']}, "
                "but should be at most 1e-10 (loosen single cases under known_divergences)"
            )
    samples = data.get("samples", 3)
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"{path}: samples={samples!r}, but should be a positive integer")
    required = {"component", "variants", "families", "dtype", "rtol", "atol", "reason"}
    for entry in data.get("known_divergences") or []:
        if not isinstance(entry, dict) or set(entry) != required:
            raise ValueError(f"{path}: known divergence {entry!r} needs exactly {sorted(required)}")
    return data


def _divergence_matches(
    entry: Mapping[str, Any], component: str, variant: str, family: str, dtype: str
) -> bool:
    """A known-divergence entry's selectors; `families: all` selects every family."""
    families = entry["families"]
    return (
        entry["component"] == component
        and variant in entry["variants"]
        and (families == "all" or family in families)
        and entry["dtype"] == dtype
    )


def _check_estimators() -> None:
    """`ESTIMATORS` entries that the adapters could not call as written."""
    for name, spec in ESTIMATORS.items():
        unknown = sorted(set(spec.hyperparameters) - set(HYPERPARAMETER_NAMES))
        if unknown:
            raise ValueError(f"ESTIMATORS[{name!r}]: unknown hyperparameters {unknown}")
        if spec.upstream_config and not spec.hyperparameters:
            raise ValueError(f"ESTIMATORS[{name!r}]: upstream_config without hyperparameters")
        if not spec.std_switch and any(f.startswith("no-std-") for f in spec.families):
            raise ValueError(f"ESTIMATORS[{name!r}]: `no-std-` families need std_switch")


def _case_plan() -> dict[str, list[tuple[str, str]]]:
    """(variant, family) pairs of every component, before dtypes."""
    _check_estimators()
    plan: dict[str, list[tuple[str, str]]] = {}
    plan["advantage"] = [(name, f) for name, spec in ESTIMATORS.items() for f in spec.families]
    scenarios = ("ragged-global", "empty-local")
    plan["policy_loss"] = [
        *(("vanilla", f"{mode}-{s}") for mode in AGG_MODE_NAMES for s in scenarios),
        ("vanilla", "token-mean-long-global"),
        # Every clip bound off its default, the dual clip reached (sides.DUAL_CLIP).
        ("vanilla", "token-mean-ragged-global-dual-clip"),
        ("actor", "seq-mean-token-sum-ragged-global-dual-clip"),
        ("actor", "token-mean-nested-global-dual-clip"),
        *(("actor", f"{mode}-{s}") for mode in AGG_MODE_NAMES for s in scenarios),
        *(("actor", f"{mode}-{s}") for mode in AGG_MODE_NAMES for s in NESTED_SCENARIOS),
    ]
    plan["agg_loss"] = [
        (mode, s)
        for mode in AGG_MODE_NAMES
        for s in ("ragged-global", "empty-local", "multiturn-global")
    ]
    plan["kl"] = [(name, f) for name in KL_PENALTY_NAMES for f in ("ragged", "large")]
    plan["kl_in_reward"] = [
        (ctrl, f) for ctrl in ("fixed", "adaptive") for f in ("kl-ragged", "low_var_kl-empty")
    ]
    plan["value_loss"] = [
        (mode, s) for mode in AGG_MODE_NAMES for s in (*scenarios, *NESTED_SCENARIOS)
    ]
    plan["entropy"] = [("logits", f) for f in ("normal", "large", "temperature")]
    plan["log_prob"] = [("logits", f) for f in ("normal", "large", "temperature", "long")]
    plan["microbatch"] = [
        (mode, f"{side}-{loss}")
        for mode in AGG_MODE_NAMES
        for loss in ("actor", "critic")
        for side in ("ours", "upstream")
    ]
    plan["sft_loss"] = [
        *(("token-mean", f"{layout}-{s}") for layout in SFT_LAYOUTS for s in SFT_SCENARIOS),
        *(("token-mean", f"microbatch-dp{dp}") for dp in SFT_DP_SIZES),
    ]
    return plan


def conformance_cases(tolerances: Mapping[str, Any]) -> list[ConformanceCase]:
    """Every case, in a stable order, with its tolerance; ids are unique."""
    samples = int(tolerances.get("samples", 3))
    table = tolerances["tolerances"]
    divergences = list(tolerances.get("known_divergences") or [])
    used = [False] * len(divergences)
    cases: list[ConformanceCase] = []
    for component, pairs in _case_plan().items():
        for variant, family in pairs:
            for dtype in DTYPE_NAMES:
                rtol, atol = table[component][dtype]["rtol"], table[component][dtype]["atol"]
                reason = ""
                for k, entry in enumerate(divergences):
                    if _divergence_matches(entry, component, variant, family, dtype):
                        rtol, atol, reason = entry["rtol"], entry["atol"], entry["reason"]
                        used[k] = True
                fraction = table[component]["float32"]
                cases.append(
                    ConformanceCase(
                        id=f"{component}.{variant}[{family}-{dtype}]",
                        component=component,
                        variant=variant,
                        family=family,
                        dtype=dtype,
                        rtol=float(rtol),
                        atol=float(atol),
                        samples=samples,
                        fraction_rtol=float(fraction["rtol"]),
                        fraction_atol=float(fraction["atol"]),
                        divergence=str(reason).strip(),
                    )
                )
    unmatched = [
        f"{d['component']} {d['variants']} {d['families']} {d['dtype']}"
        for d, hit in zip(divergences, used, strict=True)
        if not hit
    ]
    if unmatched:
        raise ValueError(f"known divergences match no case: {unmatched}")
    ids = [case.id for case in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate conformance case ids: {duplicates}")
    return cases


@lru_cache(maxsize=1)
def pinned_version() -> str:
    """The upstream version the embedded corpus pins: its manifest is where the version is written."""
    return load_manifest(default_manifest_path()).upstream.version


@lru_cache(maxsize=8)  # asked once per case (282 in the default audit)
def upstream_missing_reason(release: str | None = None) -> str | None:
    """Why ``release``'s upstream side cannot be computed here (it runs in the release's own
    environment: a supported release with a lock for this platform), or None; builds nothing,
    imports nothing of verl."""
    from pytest_verl_compat.releases.environment import load_lock
    from pytest_verl_compat.releases.index import ReleaseError, load_release_index

    try:
        load_lock(load_release_index().supported_release(release or pinned_version()))
    except ReleaseError as exc:
        return str(exc)
    return None


def comparison_missing_reason(release: str | None = None) -> str | None:
    """Why a comparison of our side with ``release``'s cannot run here, or None: upstream's side
    runs in the release's environment (``upstream_missing_reason``), ours in this process, on
    the reference trainer's torch (the [trainer] extra; the plugin alone installs without it)."""
    missing = upstream_missing_reason(release)
    if missing is not None:
        return missing
    if importlib.util.find_spec("torch") is None:
        return (
            "our side runs the reference trainer's math, which needs the [trainer] extra "
            "(torch is not installed): pip install 'pytest-verl-compat[trainer]'"
        )
    return None
