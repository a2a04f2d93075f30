"""The pages of the rules whose findings no static check gives: upstream's own early checks by the
phase at which 0.9.0 raises (``upstream.<phase>``, named by ``UpstreamFailure.check_id``), a
composition that Hydra rejects (``compose``), and a launch script the reader cannot follow
(``launch.*``). A new phase of the probes (``probes/``) registers its page here, with an example that
upstream's own check fails on and its valid twin (tests/test_rule_pages.py runs both through the
oracle process).
"""

from __future__ import annotations

import dataclasses

from pytest_verl_compat.checks import Example, RuleDoc, register_rule, rule_docs
from pytest_verl_compat.checks.examples import MICRO, STATIC
from pytest_verl_compat.model import COMPOSE_RULE
from pytest_verl_compat.pipeline import suppress  # registers directive.unused
from pytest_verl_compat.upstream.verdict.early import (
    NEVER_READ_RULE,
    OVERRIDDEN_RULE,
    TYPE_ANNOTATION,
)

COMPOSE = COMPOSE_RULE
LAUNCH_UNREADABLE = "launch.unreadable"
LAUNCH_NO_LAUNCHER = "launch.no-launcher"
LAUNCH_UNKNOWN_ENTRY = "launch.unknown-entry-point"
LAUNCH_RUNTIME = "launch.run-time-value"
LAUNCH_RUNTIME_CONDITION = "launch.run-time-condition"

_UPSTREAM = "upstream's own check, run in the sandboxed oracle process (verl-compat check)"

UPSTREAM_RULES = (
    RuleDoc(
        "upstream.trainer-start",
        "error",
        "Upstream's `validate_config` (and the configuration dataclasses it converts) on the "
        "resolved mapping, as `main_ppo` calls it before any worker starts; the finding quotes "
        "upstream's message and the line that raised it.",
        "verl/trainer/main_ppo.py:178 (validate_config, verl/utils/config.py:74)",
        "change the keys upstream's message names; the finding cites the statement that fails",
        Example(
            fires=(
                "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
                "actor_rollout_ref.rollout.temperature=0",
            ),
            twin=(
                "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
                "actor_rollout_ref.rollout.temperature=1.0",
            ),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        "upstream.config-load",
        "error",
        "A configuration section converted to its dataclass (`omega_conf_to_dataclass`) where "
        "the pinned release converts it, outside validate_config: the dataclass's `__post_init__` refuses it.",
        "verl/utils/config.py:23 (omega_conf_to_dataclass; e.g. RolloutConfig.__post_init__, "
        "verl/workers/config/rollout.py:293)",
        "change the keys the dataclass's message names",
        Example(
            fires=(
                "actor_rollout_ref.rollout.expert_parallel_size=4",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "actor_rollout_ref.rollout.data_parallel_size=1",
            ),
            twin=(
                "actor_rollout_ref.rollout.expert_parallel_size=2",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "actor_rollout_ref.rollout.data_parallel_size=1",
            ),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        "upstream.trainer-init",
        "error",
        "The trainer's own construction and `_setup`, run (`get_trainer_cls`, `PPOTrainer.__init__`, "
        "the data loaders' batch arithmetic, the resource pools, the reward manager's lookup, the "
        "checkpoint resume), or an asynchronous trainer's task runner (`fully_async_main`, "
        "`one_step_off_policy`: the trainer, rollouter and workers it builds, their resume): with "
        "the cluster, the data and the user's files stood in, never imported or read.",
        "verl/trainer/main_ppo.py:130-156 (TaskRunnerV1.run); verl/trainer/ppo/v1/trainer_base.py:229 "
        "(_setup); verl/experimental/fully_async_policy/fully_async_main.py:50-112 "
        "(FullyAsyncTaskRunner._initialize_components)",
        "change the keys the finding names, so that the statement it quotes holds",
        Example(
            fires=("trainer.resume_mode=resume_path",),
            twin=(
                "trainer.resume_mode=resume_path",
                "trainer.resume_from_path=ckpt/global_step_10",
            ),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        "upstream.worker-start",
        "error",
        "The actor, reference, rollout and critic workers' construction, run: "
        "`ActorRolloutRefWorker.__init__`/`init_model`, `TrainingWorker.__init__` and the engines' "
        "`__init__` with their data-parallel meshes on rank 0 of the configuration's world (no "
        "GPU, no model files), the rollout and checkpoint engines' registries.",
        "verl/workers/engine_workers.py:533 (ActorRolloutRefWorker.init_model); "
        "verl/workers/engine/base.py:398 (EngineRegistry)",
        "change the keys the finding names, so that the statement it quotes holds",
        Example(
            fires=(
                "actor_rollout_ref.actor.use_dynamic_bsz=True",
                "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
            ),
            twin=(
                "actor_rollout_ref.actor.use_dynamic_bsz=True",
                "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
            ),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        "upstream.first-update",
        "error",
        "The first actor or critic update, run on the constructed workers up to where a model "
        "would compute: `TrainingWorker.train_mini_batch` (the mini-batch split over the "
        "data-parallel ranks, `make_iterator`, `prepare_micro_batches`), the loss (`ppo_loss`, "
        "`value_loss`: the policy-loss and KL registries, the dual-clip bound) on a tiny batch, the "
        "engine's optimizer, its gradient clip and its learning-rate scheduler.",
        "verl/workers/engine_workers.py:242 (TrainingWorker.train_mini_batch); "
        "verl/workers/utils/losses.py:57 (ppo_loss); verl/workers/config/optimizer.py:298 "
        "(build_optimizer)",
        "change the keys the finding names, so that the statement it quotes holds",
        Example(
            fires=("actor_rollout_ref.actor.ppo_mini_batch_size=100",),
            twin=("actor_rollout_ref.actor.ppo_mini_batch_size=128",),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        "upstream.first-step",
        "error",
        "The first step before the update, run: the trainer's `_compute_advantage` (KL in the "
        "reward, rollout correction, the advantage estimator's registry and checks) on a tiny "
        "batch, the batch's padding multiple, and each worker's log-prob pass "
        "(`prepare_micro_batches` with the log-prob micro-batch size).",
        "verl/trainer/ppo/v1/trainer_base.py:1588 (_compute_advantage); "
        "verl/workers/engine_workers.py:392 (TrainingWorker.infer_batch)",
        "change the keys the finding names, so that the statement it quotes holds",
        Example(
            fires=(
                *STATIC,
                *MICRO,
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=7",
            ),
            twin=(
                *STATIC,
                *MICRO,
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
            ),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        TYPE_ANNOTATION,
        "error",
        "A key the script set to a value its configuration dataclass's annotation refuses "
        "(`ppo_micro_batch_size_per_gpu: Optional[int]` given `8x`): Hydra's instantiate checks "
        "no type, so the value reaches the code that uses it.",
        "verl/utils/config.py:52 (omega_conf_to_dataclass instantiates the dataclass unchecked)",
        "give the key a value of the annotated type",
        Example(
            fires=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8x",),
            twin=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        NEVER_READ_RULE,
        "warning",
        "A key the script set that verl accepts and never reads: a field of a configuration "
        "dataclass that no code of the checked release outside the dataclasses themselves "
        "(verl/workers/config/) refers to, and that no probe read on the V1 path. The finding "
        "names the key of the same section with the closest name that is read.",
        "verl/workers/config/actor.py:312 declares `grad_clip`; the FSDP engine clips with "
        "`optimizer_config.clip_grad` (verl/workers/engine/fsdp/transformer_impl.py:777-782)",
        "set the key that is read instead (the finding names it), or remove the key",
        Example(
            fires=("actor_rollout_ref.actor.grad_clip=0.5",),
            twin=("actor_rollout_ref.actor.optim.clip_grad=0.5",),
            upstream=True,
        ),
        _UPSTREAM,
    ),
    RuleDoc(
        OVERRIDDEN_RULE,
        "warning",
        "A key the script set that upstream's code reads, yet another key decides: perturbing its "
        "value (a number ×1.5 and ×0.5, a flag flipped) through upstream's own optimizer and "
        "scheduler builders, losses and advantage estimator on a tiny batch changes nothing they "
        "compute; or the code that reads it does not run with these settings.",
        "verl/trainer/ppo/core_algos.py:1320-1322 (compute_policy_loss_vanilla: `clip_ratio_low`/`clip_ratio_high` replace "
        "`clip_ratio` when set, and verl/trainer/config/actor/actor.yaml:39-42 sets both)",
        "set the key that decides, or remove the key",
        Example(
            fires=("actor_rollout_ref.actor.clip_ratio=0.3",),
            twin=("actor_rollout_ref.actor.clip_ratio_low=0.3",),
            upstream=True,
        ),
        _UPSTREAM,
    ),
)

LOCAL_RULES = (
    RuleDoc(
        COMPOSE,
        "error",
        "Hydra's composition of the pinned config tree with the script's fields: an override of a "
        "key the tree does not have, `+key=` for a key it has, a config group option that does "
        "not exist, a value of the wrong type. verl's entry point refuses the same fields before "
        "anything runs.",
        "Hydra 1.3.2 compose, as verl/trainer/main_ppo.py's @hydra.main does",
        "use the key as the tree spells it (`+key=` only for a new key, `++key=` to force)",
        Example(
            fires=("actor_rollout_ref.actor.no_such_key=1",),
            twin=("actor_rollout_ref.actor.ppo_epochs=1",),
        ),
        "Hydra's composition of the pinned tree",
    ),
    RuleDoc(
        LAUNCH_UNREADABLE,
        "error",
        "The launch reader cannot tell the launcher's argv without running the script: `eval`, "
        "`source`, a function, a run-time value that reaches the argv, … The finding names the "
        "line and the binding that fixes it when there is one.",
        "not upstream's: the reader follows bash's semantics and refuses what it cannot know "
        "(pytest_verl_compat/bash)",
        "bind the value (--env NAME=VALUE, --subst COMMAND OUTPUT) or write the override literally",
        None,
        "the launch reader",
    ),
    RuleDoc(
        LAUNCH_RUNTIME,
        "info",
        "A run-time value (`$(date +%Y%m%d_%H%M)`, `$RANDOM`, `$(hostname)`, `$PWD`) where a "
        "value only names something: a run or a project (`trainer.experiment_name`, read only by "
        "the loggers, verl/trainer/ppo/v1/trainer_base.py:400), a file or a folder "
        "(`data.train_files=$PWD/data/train.parquet`), torchrun's rendezvous port "
        "(`--master_port=$((RANDOM % 1000 + 20000))`). The value is carried as a placeholder "
        "(`RUNTIME_PWD`) and the verdict is given for any value there "
        "(pytest_verl_compat/data/naming.yaml lists each place, what it names and where verl "
        "reads it). A run-time value anywhere else (a size, a count, a flag, a model whose "
        "config.json the model checks read, torchrun's `--nproc_per_node`, the step number of "
        "`trainer.resume_from_path`, verl/trainer/ppo/v1/trainer_base.py:812-823, the run's name "
        "under the GDPO reward manager, which hands it to the reward function) decides what the "
        "run does and stays `launch.unreadable`.",
        "not upstream's: the launch reader (pytest_verl_compat/bash) carries the value, the read "
        "stage decides where it may stay unknown (pytest_verl_compat/pipeline/naming.py)",
        "nothing to do; bind the value (--env NAME=VALUE, --subst COMMAND OUTPUT) to see it",
        None,
        "the launch reader",
    ),
    RuleDoc(
        LAUNCH_RUNTIME_CONDITION,
        "info",
        'A test only decided where the script runs parts its ways (`if [ -d "$HOME/models/Qwen" '
        "]; then MODEL=$HOME/models/Qwen; else MODEL=Qwen/Qwen2.5-7B; fi`, `[ -f .env ] && A=1 "
        "|| A=2`, `if command -v nvidia-smi >/dev/null`, a test of `$(hostname)`): the reader "
        "follows each way, never guessing which the run takes, and each way's launch is composed "
        "and checked. When every way gives the same findings they are the script's and this note "
        "names the tests; otherwise each finding that not every way shares is given with its way "
        "(`[when [ -d … ] (line 2) is false]`) and the script is valid only if every way is. "
        "Past 8 ways the script is `launch.unreadable`, naming the tests' lines.",
        "not upstream's: the launch reader follows each way (pytest_verl_compat/bash/branches.py, "
        "ways.py) and check gives one result (pytest_verl_compat/cli/check_ways.py)",
        "nothing to do; bind what the tests read (--env NAME=VALUE, --subst COMMAND OUTPUT) to "
        "check one way only",
        None,
        "the launch reader",
    ),
    RuleDoc(
        LAUNCH_NO_LAUNCHER,
        "info",
        "The script reaches no launch of one of the pinned release's entry points (`python3 -m "
        "verl.trainer.main_ppo`, `torchrun … -m verl.trainer.sft_trainer`, …) with these "
        "bindings (it exits first, or runs none): nothing to check.",
        "not upstream's: the entry points are the checked release's @hydra.main modules "
        "(pipeline/entry_points.py)",
        "nothing, if the script is not a launch script; otherwise bind what makes it reach "
        "the launcher (--arg WORD, --env NAME=VALUE)",
        None,
        "the launch reader",
    ),
    RuleDoc(
        LAUNCH_UNKNOWN_ENTRY,
        "error",
        "The script launches a module under verl (or an older release's recipe) that the pinned "
        "release does not have: Python fails at once with `No module named …`.",
        "the pinned release's modules, as installed (pipeline/entry_points.py lists its "
        "@hydra.main entry points)",
        "launch the entry point the release has (the finding names the closest), or pin the "
        "release the script was written for",
        None,
        "the session, from the launch reader's module",
    ),
)

for _doc in (*UPSTREAM_RULES, *LOCAL_RULES):
    register_rule(_doc)


def all_rules(version: str = "", profile: str = "") -> dict[str, RuleDoc]:
    """Every rule's page by id: the static checks', upstream's phases, compose, launch.* and the
    directives' (``suppress.UNUSED_DIRECTIVE``); a check's evidence may name ``{version}`` and
    ``{profile}``, filled here when given (as the registry fills them in each finding)."""
    assert suppress.UNUSED_DIRECTIVE in rule_docs()
    docs = rule_docs()
    if not version:
        return docs
    return {
        rule: dataclasses.replace(doc, why=doc.why.format(version=version, profile=profile))
        for rule, doc in docs.items()
    }
