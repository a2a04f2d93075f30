"""Issue 22's five classes of mistakes, each from a new example and its near-identical valid twin.

Every example goes through ``check_case`` (what ``verl-compat check`` and the plugin's verdict
stage run) with upstream's probes answering in the sandboxed oracle process:

1. errors 0.9.0 raises after ``validate_config``: trainer construction, worker and engine
   construction, the first step's registries and batch arithmetic;
2. keys without effect: never read (a sibling is read instead), read but overridden, read only
   under a flag the script left off; keys that do act stay clean;
3. every upstream error names configuration keys, never a phase;
4. values of the wrong type: an ERROR naming key, value and expected type, never a traceback;
5. the V1 critic's micro-batch division that never runs is no error.
"""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from corpus_facts import needs_release, release_root
from hostile_canary import Canary

from pytest_verl_compat.model import Finding
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.verdict.case import CaseCheck, check_case, live_asker

CLI = (sys.executable, "-m", "pytest_verl_compat.cli")

pytestmark = needs_release()

ARR = "actor_rollout_ref"
A = f"{ARR}.actor"
_ids = itertools.count()


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def check(
    session: AuditSession, oracle: UpstreamOracle, base: str, overrides: Sequence[str]
) -> CaseCheck:
    """check's verdict on a corpus case with ``--set`` overrides."""
    assert session.manifest is not None
    case = dataclasses.replace(session.manifest.case(base), id=f"{base}+probe{next(_ids)}")
    case = session.with_overrides(case, tuple(overrides))
    return check_case(session, case, live_asker(session, None, oracle))


def by_rule(result: CaseCheck, rule: str) -> list[Finding]:
    return [f for f in result.findings if f.rule == rule]


def upstream_errors(result: CaseCheck) -> list[Finding]:
    return [f for f in result.findings if f.level == "error" and f.rule.startswith("upstream.")]


# --- 1. errors after validate_config ------------------------------------------------------------

# Micro-batches by count, not by tokens, that divide the grpo case's batch (8 GPUs, 1024 × 5).
STATIC_BATCHES = (
    f"{A}.use_dynamic_bsz=false",
    f"{A}.ppo_micro_batch_size_per_gpu=4",
    f"{ARR}.rollout.log_prob_use_dynamic_bsz=false",
    f"{ARR}.ref.log_prob_use_dynamic_bsz=false",
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=8",
)
# On-policy distillation with a top-k loss, one teacher of four replicas on its own node.
TOPK_DISTILLATION = (
    "distillation.enabled=True",
    "distillation.n_gpus_per_node=8",
    "distillation.nnodes=1",
    "distillation.teacher_models.teacher_model.model_path=/home/verl/teacher",
    "distillation.teacher_models.teacher_model.key=gsm8k",
    "distillation.teacher_models.teacher_model.num_replicas=4",
    "distillation.distillation_loss.loss_mode=forward_kl_topk",
)
# (case, rule, the key the finding must name, words of upstream's message, fires, valid twin)
AFTER_VALIDATE = {
    # The key the script set decides it (issue 29): resume_mode; the fix names the path too.
    "resume-without-path": (
        "grpo",
        "upstream.trainer-init",
        "trainer.resume_mode",
        "resume ckpt must be str type",
        ("trainer.resume_mode=resume_path",),
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_10"),
    ),
    "resume-path-without-step": (
        "grpo",
        "upstream.trainer-init",
        "trainer.resume_from_path",
        "resume ckpt must specify the global_steps",
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/latest"),
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_200"),
    ),
    "rollout-engine-name": (
        "grpo",
        "upstream.worker-start",
        f"{ARR}.rollout.name",
        "vlm",
        (f"{ARR}.rollout.name=vlm",),
        (f"{ARR}.rollout.name=sglang",),
    ),
    "policy-loss-registry": (
        "grpo",
        "upstream.first-update",
        f"{A}.policy_loss.loss_mode",
        "gpso",
        (f"{A}.policy_loss.loss_mode=gpso",),
        (f"{A}.policy_loss.loss_mode=gspo",),
    ),
    "advantage-registry": (
        "grpo",
        "upstream.first-step",
        "algorithm.adv_estimator",
        "grpo_pass_k",
        ("algorithm.adv_estimator=grpo_pass_k",),
        ("algorithm.adv_estimator=grpo_passk",),
    ),
    "log-prob-micro-batch": (
        "grpo",
        "upstream.first-step",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
        "divi",  # upstream's "divisible", or the static check's "do not divide" standing for it
        (*STATIC_BATCHES, f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=6"),
        (*STATIC_BATCHES, f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=8"),
    ),
    # PPOTrainer.step's first batch is whole gen_batch_size fetches (trainer_base.py:1328-1340).
    "gen-batch-size": (
        "grpo",
        "upstream.first-step",
        "data.gen_batch_size",
        "must be a positive multiple of gen_batch_size (96)",
        ("data.gen_batch_size=96",),
        ("data.gen_batch_size=256",),
    ),
    # Top-k distillation's logits processor with the fsdp2 actor (distillation/losses.py:137-148).
    "topk-distillation-strategy": (
        "grpo",
        "upstream.first-update",
        f"{A}.strategy",
        "Unsupported strategy",
        (*TOPK_DISTILLATION, f"{A}.strategy=fsdp2"),
        (*TOPK_DISTILLATION, f"{A}.strategy=fsdp"),
    ),
}


@pytest.mark.parametrize("name", sorted(AFTER_VALIDATE))
def test_an_error_after_validate_config_names_its_key_and_the_twin_is_clean(
    name: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    base, rule, key, words, fires, twin = AFTER_VALIDATE[name]
    bad = check(session, oracle, base, fires)
    assert not bad.upstream_skipped, bad.upstream_skipped
    errors = [f for f in bad.findings if f.level == "error" and key in f.path.split(", ")]
    assert errors, f"no error naming {key}: {[f.line() for f in bad.findings]}"
    assert any(words in f.message for f in errors), [f.message for f in errors]
    assert not bad.valid
    assert any(f.rule == rule for f in errors) or any(
        f.rule != rule and not f.rule.startswith("upstream.") for f in errors
    ), f"{rule} (or a static check that stands for it) expected: {[f.rule for f in errors]}"
    good = check(session, oracle, base, twin)
    assert good.valid, [f.line() for f in good.findings if f.level == "error"]
    assert not [f for f in good.findings if f.level == "error"]


MEGATRON_EXAMPLE = "examples/gpg_trainer/run_qwen3_8b_megatron"
PER_TOKEN_LOSS = f"+{A}.megatron.override_transformer_config.calculate_per_token_loss=True"


def test_a_megatron_engine_error_names_the_keys_the_script_set_and_the_twin_is_clean(
    session: AuditSession, oracle: UpstreamOracle
) -> None:
    """The Megatron engine's per-token-loss check (transformer_impl.py:1446-1455), run by check on
    verl's Megatron example: an error at the loss aggregation and the override that asks for the
    per-token regime; token-mean, the same override, is clean."""
    from pytest_verl_compat.pipeline.manifest import default_examples_path, load_examples

    assert session.manifest is not None
    examples = load_examples(default_examples_path(), session.manifest.bindings)
    base = next(case for case in examples if case.id == MEGATRON_EXAMPLE)

    def checked(*overrides: str) -> CaseCheck:
        case = dataclasses.replace(base, id=f"{base.id}+probe{next(_ids)}")
        return check_case(
            session, session.with_overrides(case, overrides), live_asker(session, None, oracle)
        )

    bad = checked(PER_TOKEN_LOSS, f"{A}.loss_agg_mode=seq-mean-token-mean")
    errors = by_rule(bad, "upstream.first-update")
    assert errors, [f.line() for f in bad.findings]
    keys = set(errors[0].path.split(", "))
    assert {f"{A}.loss_agg_mode", PER_TOKEN_LOSS[1:].partition("=")[0]} <= keys, keys
    assert "seq-mean-token-mean" in errors[0].message and not bad.valid
    good = checked(PER_TOKEN_LOSS, f"{A}.loss_agg_mode=token-mean")
    assert good.valid, [f.line() for f in good.findings if f.level == "error"]


# --- 2. keys without effect ----------------------------------------------------------------------

# (case, fires, the key, what the finding must name instead, valid twin)
WITHOUT_EFFECT = {
    "grad-clip-never-read": (
        "grpo",
        (f"{A}.grad_clip=0.5",),
        f"{A}.grad_clip",
        f"{A}.optim.clip_grad",
        (f"{A}.optim.clip_grad=0.5",),
    ),
    "clip-ratio-behind-its-pair": (
        "grpo",
        (f"{A}.clip_ratio=0.3",),
        f"{A}.clip_ratio",
        "",
        (f"{A}.clip_ratio_low=0.3", f"{A}.clip_ratio_high=0.3"),
    ),
    "min-lr-ratio-under-a-constant-schedule": (
        "grpo",
        (f"{A}.optim.min_lr_ratio=0.1",),
        f"{A}.optim.min_lr_ratio",
        "",
        (f"{A}.optim.min_lr_ratio=0.1", f"{A}.optim.lr_scheduler_type=cosine"),
    ),
    "warmup-ratio-behind-warmup-steps": (
        "grpo",
        (f"{A}.optim.lr_warmup_steps=10", f"{A}.optim.lr_warmup_steps_ratio=0.1"),
        f"{A}.optim.lr_warmup_steps_ratio",
        "",
        (f"{A}.optim.lr_warmup_steps=-1", f"{A}.optim.lr_warmup_steps_ratio=0.1"),
    ),
    "kl-loss-coef-without-the-kl-loss": (
        "dr_grpo",
        (f"{A}.kl_loss_coef=0.01",),
        f"{A}.kl_loss_coef",
        f"{A}.use_kl_loss=True",
        (f"{A}.kl_loss_coef=0.01", f"{A}.use_kl_loss=true"),
    ),
    "kl-controller-without-kl-in-reward": (
        "grpo",
        ("algorithm.kl_ctrl.kl_coef=0.01",),
        "algorithm.kl_ctrl.kl_coef",
        "algorithm.use_kl_in_reward=True",
        ("algorithm.kl_ctrl.kl_coef=0.01", "algorithm.use_kl_in_reward=true"),
    ),
}


@pytest.mark.parametrize("name", sorted(WITHOUT_EFFECT))
def test_a_key_without_effect_is_a_warning_and_its_twin_is_clean(
    name: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    base, fires, key, instead, twin = WITHOUT_EFFECT[name]
    bad = check(session, oracle, base, fires)
    found = [f for f in bad.findings if f.rule.startswith("effect.") and f.path == key]
    assert found, f"no effect finding on {key}: {[f.line() for f in bad.findings]}"
    assert found[0].level == "warning" and found[0].evidence
    assert instead in found[0].message + found[0].fix, found[0].line()
    good = check(session, oracle, base, twin)
    effect = [f.line() for f in good.findings if f.rule.startswith("effect.")]
    assert not effect, effect


# Keys that act, set at once at values other than their defaults: none is without effect.
ACTING = {
    "ppo": (
        f"{A}.entropy_coeff=0.01",
        f"{A}.optim.weight_decay=0.05",
        f"{A}.optim.lr=2e-6",
        f"{A}.optim.betas=[0.9,0.95]",
        f"{A}.optim.clip_grad=0.8",
        f"{A}.optim.lr_warmup_steps=5",
        f"{A}.optim.lr_scheduler_type=cosine",
        f"{A}.optim.min_lr_ratio=0.1",
        f"{A}.clip_ratio_c=5.0",
        f"{A}.clip_ratio_high=0.28",
        f"{A}.loss_agg_mode=seq-mean-token-mean",
        f"{A}.use_kl_loss=true",
        f"{A}.kl_loss_coef=0.01",
        f"{A}.kl_loss_type=low_var_kl",
        "critic.optim.lr=5e-6",
        "critic.optim.weight_decay=0.02",
        "critic.optim.clip_grad=0.7",
        "critic.cliprange_value=0.3",
        "algorithm.gamma=0.99",
        "algorithm.lam=0.9",
    ),
    "grpo": (
        f"{A}.policy_loss.loss_mode=gspo",
        f"{A}.clip_ratio_low=0.0003",
        f"{A}.clip_ratio_high=0.0004",
        f"{A}.optim.lr_warmup_steps_ratio=0.05",
        "algorithm.norm_adv_by_std_in_grpo=false",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.kl_coef=0.002",
    ),
    # A value whose regime no perturbation leaves (CISPO's 1 - clip_ratio_low never binds at 10,
    # nor at 20) still differs from removing the key: the default 0.2 binds.
    "grpo+cispo": (
        f"{A}.policy_loss.loss_mode=cispo",
        f"{A}.clip_ratio_low=10",
        f"{A}.clip_ratio_high=0.2",
    ),
    # DPPO's thresholds on prob - old_prob (core_algos.py:1431) and its truncation.
    "grpo+dppo": (
        f"{A}.policy_loss.loss_mode=dppo_tv",
        f"{A}.clip_ratio_low=0.15",
        f"{A}.clip_ratio_high=0.15",
        f"{A}.clip_ratio_c=10000.0",
    ),
}


@pytest.mark.parametrize("base", sorted(ACTING))
def test_keys_that_act_have_no_effect_finding_and_no_type_finding(
    base: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    result = check(session, oracle, base.partition("+")[0], ACTING[base])
    assert not result.upstream_skipped, result.upstream_skipped
    noise = [f.line() for f in result.findings if f.rule.startswith(("effect.", "types."))]
    assert not noise, noise


# --- 3. every upstream error names keys ---------------------------------------------------------


def test_no_upstream_error_is_named_by_a_phase(
    session: AuditSession, oracle: UpstreamOracle
) -> None:
    """Every example above that fails in upstream names keys of the resolved tree as its path."""
    mapping = session.outcome(session.manifest.case("grpo")).composition.mapping  # type: ignore[union-attr]
    leaves = set(_leaves(mapping))
    seen = 0
    for base, _, _, _, fires, _ in AFTER_VALIDATE.values():
        for finding in upstream_errors(check(session, oracle, base, fires)):
            keys = finding.path.split(", ")
            assert keys and set(keys) <= leaves, finding.line()
            assert not finding.path.startswith("upstream"), finding.line()
            seen += 1
    assert seen >= 4


def _leaves(node: object, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


# --- 4. types -----------------------------------------------------------------------------------

# (the override, the key, words the message must hold); the twin sets a value of the right type.
WRONG_TYPES = {
    "batch-size-word": ("data.train_batch_size=abc", "data.train_batch_size", "'abc'", "256"),
    "unset-variable": ("trainer.n_gpus_per_node=", "trainer.n_gpus_per_node", "empty", "8"),
    "learning-rate-word": (f"{A}.optim.lr=fast", f"{A}.optim.lr", "'fast'", "1e-6"),
    "flag-word": (f"{A}.use_kl_loss=maybe", f"{A}.use_kl_loss", "'maybe'", "true"),
    "micro-batch-with-unit": (
        f"{A}.ppo_micro_batch_size_per_gpu=8x",
        f"{A}.ppo_micro_batch_size_per_gpu",
        "'8x'",
        "8",
    ),
    "mini-batch-fraction": (
        f"{A}.ppo_mini_batch_size=64.5",
        f"{A}.ppo_mini_batch_size",
        "64.5",
        "64",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG_TYPES))
def test_a_wrong_type_is_an_error_naming_key_value_and_type(
    name: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    override, key, words, good_value = WRONG_TYPES[name]
    bad = check(session, oracle, "grpo", (override,))
    typed = [f for f in bad.findings if f.rule.startswith("types.") and f.path == key]
    assert typed, [f.line() for f in bad.findings]
    assert typed[0].level == "error" and words in typed[0].message, typed[0].line()
    assert "expects" in typed[0].message and not bad.valid
    good = check(session, oracle, "grpo", (f"{key}={good_value}",))
    assert not [f for f in good.findings if f.rule.startswith("types.")]


# Strings a config dataclass's annotation admits although the tree's default is a number: the
# annotation is upstream's typing (verl/trainer/config/algorithm.py:179 ``str | float``), read
# through ``algorithm._target_`` (AlgoConfig) even where the selected path never builds it. Each
# with a near-identical value the annotation refuses, which stays an error.
ANNOTATED = {
    "threshold-pair": (
        "algorithm.rollout_correction.rollout_is_threshold",
        "0.5_4.0",
        "algorithm.kl_ctrl.kl_coef",
        "high",
    ),
}


@pytest.mark.parametrize("name", sorted(ANNOTATED))
def test_a_string_the_annotation_admits_is_no_type_error(
    name: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    key, admitted, other, refused = ANNOTATED[name]
    result = check(session, oracle, "grpo", (f"{key}={admitted}",))
    assert not [f.line() for f in result.findings if f.rule.startswith("types.")]
    bad = check(session, oracle, "grpo", (f"{other}={refused}",))
    assert [f for f in bad.findings if f.rule.startswith("types.") and f.path == other]


@pytest.mark.parametrize(
    "override", [WRONG_TYPES[n][0] for n in ("batch-size-word", "unset-variable")]
)
def test_a_wrong_type_on_the_command_line_is_findings_not_a_traceback(
    override: str, upstream_checkout: Path, tmp_path: Path
) -> None:
    run = subprocess.run(
        [*CLI, "--upstream", str(upstream_checkout), "check", "grpo", "--set", override, "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr and "types.wrong-type" in run.stdout, run.stdout


# --- 5. the V1 critic never divides its batch by the micro-batch --------------------------------


def test_the_v1_critic_micro_batch_is_no_error_while_the_actors_is(
    session: AuditSession, oracle: UpstreamOracle
) -> None:
    """trainer_base.py:250-252 never sets the critic engine's use_dynamic_bsz, so its micro-batch
    size never divides anything (the critic.batch-settings-ignored warning); the actor's does."""
    critic = check(
        session,
        oracle,
        "ppo",
        ("critic.use_dynamic_bsz=false", "critic.ppo_micro_batch_size_per_gpu=3"),
    )
    errors = [f.line() for f in critic.findings if f.level == "error"]
    assert critic.valid and not errors, errors
    assert by_rule(critic, "critic.batch-settings-ignored")
    actor = check(
        session,
        oracle,
        "ppo",
        (f"{A}.use_dynamic_bsz=false", f"{A}.ppo_micro_batch_size_per_gpu=3"),
    )
    assert not actor.valid
    assert [f for f in actor.findings if f"{A}.ppo_micro_batch_size_per_gpu" in f.path]


# --- untrusted input stays data ------------------------------------------------------------------


def test_the_users_modules_and_files_are_never_imported_or_read(
    session: AuditSession, oracle: UpstreamOracle, canary: Canary, tmp_path: Path
) -> None:
    """A custom reward function, a custom dataset class, an external library, a checkpoint to
    resume: the probes look the names up as upstream does, up to the import or the read, which
    they refuse."""
    module = tmp_path / "evil_reward.py"
    module.write_text(f"import os\n{canary.python}\ndef compute_score(*a, **k):\n    return 0.0\n")
    sys_path_module = tmp_path / "evil_lib.py"
    sys_path_module.write_text(f"{canary.python}\n")
    result = check(
        session,
        oracle,
        "grpo",
        (
            f"reward.custom_reward_function.path={module}",
            "reward.custom_reward_function.name=compute_score",
            f"data.custom_cls.path={module}",
            "data.custom_cls.name=Evil",
            f"{ARR}.model.external_lib=evil_lib",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path}/global_step_1",
        ),
    )
    assert not result.upstream_skipped, result.upstream_skipped
    assert not canary.fired()


def test_a_model_output_the_stand_in_does_not_make_is_not_evaluated() -> None:
    """A loss that reads an output only the model's forward makes (the distillation losses of the
    top-k logits processor) meets the probe's limit, not the configuration's: not evaluated."""
    from release_python import run_in_release

    found = run_in_release(
        """
        from pytest_verl_compat.upstream.probes.records import Collector
        from pytest_verl_compat.upstream.probes.tiny_batch import StandInOutput

        collector = Collector({})
        output = StandInOutput(log_probs=1.0)
        read = collector.run(
            "first update: the loss (actor)", lambda: output["log_probs"], "loss"
        )
        collector.run(
            "first update: the loss (actor)",
            lambda: output["distillation_losses"],
            "the worker's loss_fn",
            partial_batch=True,
        )
        result = [read, len(collector.records), [n["reason"] for n in collector.not_run]]
        """
    )
    read, records, reasons = found
    assert read == 1.0 and records == 0
    assert "distillation_losses" in reasons[0]


def test_fields_read_by_reflection_are_read(tmp_path: Path) -> None:
    """A function that walks a config parameter with ``fields``/``asdict`` reads every field of
    its annotated class (VeOmni's ``*_implementation`` selectors), so none is "never read"; a
    class only passed around, or walked through an unannotated name, is not reflected."""
    from pytest_verl_compat.upstream.probes.effects import _scan, reflected_classes

    package = tmp_path / "verl"
    (package / "workers" / "config").mkdir(parents=True)
    (package / "engine.py").write_text(
        "from dataclasses import asdict, fields\n"
        "def forward(engine_config: 'KernelConfig', other: PlainConfig, loose):\n"
        "    use(other)\n"
        "    fields(loose)\n"
        "    return {f.name: getattr(engine_config, f.name) for f in fields(engine_config)}\n"
        "def dump(cfg: mod.DumpConfig):\n"
        "    return asdict(cfg)\n"
    )
    assert _scan(package)[1] == {"KernelConfig", "DumpConfig"}
    assert "VeOmniEngineConfig" in reflected_classes(release_root() / "verl")


def test_without_verl_the_static_type_check_follows_the_annotations(
    session: AuditSession,
) -> None:
    """The static rule alone (no oracle): the annotated string stays clean, its twin of a key
    whose annotation is a float still fires."""
    for name, (key, admitted, other, refused) in ANNOTATED.items():
        assert session.manifest is not None
        case = dataclasses.replace(session.manifest.case("grpo"), id=f"grpo+static-{name}")
        ok = check_case(session, session.with_overrides(case, (f"{key}={admitted}",)), None)
        assert not [f.line() for f in ok.findings if f.rule.startswith("types.")]
        case = dataclasses.replace(case, id=f"{case.id}-bad")
        bad = check_case(session, session.with_overrides(case, (f"{other}={refused}",)), None)
        assert [f for f in bad.findings if f.rule == "types.wrong-type" and f.path == other]
