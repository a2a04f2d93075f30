"""The V1 trainer's loop over the whole run: which steps it takes, and what its settings do there.

``PPOTrainer.fit`` (verl/trainer/ppo/v1/trainer_base.py:380-500, every ``trainer.v1.trainer_mode``)
starts at step 1, or one past a resumed checkpoint's step (:429, :815), and runs while the epoch
is below ``trainer.total_epochs`` and the step at most ``total_training_steps`` (:443), which is
``trainer.total_training_steps`` when set, else the steps of an epoch (the data set's rows //
``data.train_batch_size``, :710) × the epochs (:713-716). At each step it profiles when the step
is listed in ``global_profiler.steps`` (:434-437, :1295-1298), updates the actor once
``trainer.critic_warmup`` <= the step (:582), saves and validates at the multiples of
``save_freq``/``test_freq`` and at the last step (:457-459, :467-468).

What a launch script decides alone: the steps' bounds when ``trainer.total_training_steps`` is
set, an upper bound on the data set's rows when ``data.train_max_samples`` caps verl's own
``RLHFDataset`` (verl/utils/dataset/rl_dataset.py:185-192, its ``__len__`` :296; a custom data set
class may ignore it), and a resume path's step. Each rule below claims only what follows from
those and the lines it cites; where the data decides, it says nothing. The asynchronous trainers
loop otherwise (by parameter versions); fully_async_main's end of run is checked on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import uses_v1
from pytest_verl_compat.checks.upstream_names import FULLY_ASYNC_MODULE

_TRAINER_BASE = "verl/trainer/ppo/v1/trainer_base.py"
# The name main_ppo's runner calls to choose the V1 trainer (verl/trainer/main_ppo.py:141): a
# launch whose entry point calls it runs trainer_base's fit (the asynchronous trainers do not).
_V1_CHOOSER = "get_trainer_cls"


@dataclass(frozen=True)
class Steps:
    """What the script decides of the run's steps."""

    # trainer.total_training_steps when set (the loop's bound, :714-715), else None.
    total: int | None
    # An upper bound on the steps of one epoch from data.train_max_samples, else None.
    per_epoch_at_most: int | None
    epochs: int
    # The step a resume_path checkpoint restores (:815), else 0: the run's first step is one past.
    resumed: int

    @property
    def at_most(self) -> int | None:
        """The last step the loop can reach, where the script bounds it."""
        bounds = [self.total] if self.total is not None else []
        if self.per_epoch_at_most is not None:
            bounds.append(self.per_epoch_at_most * self.epochs)
        return min(bounds) if bounds else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def resumed_step(trainer: Mapping[str, Any]) -> int | None:
    """The step ``_load_checkpoint`` restores from a resume path (trainer_base.py:804-815:
    ``int(path.split("global_step_")[-1])``), or None where the run finds it (``auto``) or the
    path does not parse (upstream's own assert or ``int`` refuses it: the probes say so)."""
    if trainer.get("resume_mode") != "resume_path":
        return None
    path = trainer.get("resume_from_path")
    if not isinstance(path, str) or "global_step_" not in path:
        return None
    return _int(path.split("global_step_")[-1])


def _steps(resolved: Mapping[str, Any]) -> Steps | None:
    trainer, data = resolved["trainer"], resolved["data"]
    epochs, batch = _int(trainer.get("total_epochs")), _int(data.get("train_batch_size"))
    if epochs is None or batch is None:
        return None  # a value of the wrong type: its own check says so
    total = trainer.get("total_training_steps")
    total = _int(total) if total is not None else None
    per_epoch = None
    cap = _int(data.get("train_max_samples"))
    custom = (data.get("custom_cls") or {}).get("path")
    if cap is not None and cap > 0 and batch > 0 and custom is None:
        per_epoch = cap // batch
    return Steps(total, per_epoch, epochs, resumed_step(trainer) or 0)


def _v1_loop(inp: CheckInput) -> Steps | None:
    """The run's steps when the launch runs trainer_base's fit (main_ppo's V1 trainer), else None."""
    if not uses_v1(inp.resolved):
        return None
    if inp.entry_calls and _V1_CHOOSER not in inp.entry_calls:
        return None
    return _steps(inp.resolved)


def _training_loop(inp: CheckInput) -> tuple[Steps, int] | None:
    """The V1 loop's steps and its last step when it trains at least one step up to a known
    last step; None otherwise (a run that trains nothing is run.trains-nothing's to say)."""
    steps = _v1_loop(inp)
    if steps is None or steps.at_most is None or steps.epochs <= 0:
        return None
    return None if steps.at_most < steps.resumed + 1 else (steps, steps.at_most)


def _validation_only(trainer: Mapping[str, Any]) -> bool:
    """fit returns after the first validation (trainer_base.py:414-423)."""
    return bool(trainer.get("val_before_train", True) and trainer.get("val_only", False))


@check(
    "run.no-step-per-epoch",
    level="error",
    evidence=(
        f"{_TRAINER_BASE}:710 (steps_per_epoch = len(train_dataset) // data.train_batch_size), "
        f":425 (fit divides the step by it); verl/utils/dataset/rl_dataset.py:185-192 "
        "(data.train_max_samples caps the rows)"
    ),
    summary="data.train_max_samples below data.train_batch_size: the data set holds fewer rows "
    "than one batch, an epoch has 0 steps, and fit divides by it before its first step "
    "(ZeroDivisionError).",
    fix="set data.train_max_samples to at least data.train_batch_size (or -1 for all rows)",
    example=Example(fires=("data.train_max_samples=512",), twin=("data.train_max_samples=1024",)),
)
def no_step_per_epoch(inp: CheckInput) -> Iterator[Hit]:
    steps = _v1_loop(inp)
    if steps is None or steps.per_epoch_at_most != 0 or _validation_only(inp.resolved["trainer"]):
        return
    data = inp.resolved["data"]
    yield Hit(
        "data.train_max_samples, data.train_batch_size",
        f"at most {data['train_max_samples']} rows make 0 batches of {data['train_batch_size']}: "
        f"verl {inp.version}'s fit raises ZeroDivisionError before its first step "
        f"({_TRAINER_BASE}:425, the step // steps_per_epoch)",
        fix="set data.train_max_samples to at least data.train_batch_size",
    )


@check(
    "run.trains-nothing",
    level="warning",
    evidence=(
        f"{_TRAINER_BASE}:443 (fit loops while the epoch < trainer.total_epochs and the step <= "
        "total_training_steps), :429 (the first step is 1, or one past a resumed step), :815 "
        "(the resumed step is the number after global_step_)"
    ),
    summary="A run whose loop never starts: trainer.total_epochs <= 0, "
    "trainer.total_training_steps <= 0, or a resume path at or past the last step. verl raises "
    "nothing: fit validates (if asked) and returns without training.",
    fix="give the run at least one step (a positive total_epochs and total_training_steps past "
    "the resumed step)",
    example=Example(
        fires=("trainer.total_training_steps=0",), twin=("trainer.total_training_steps=1",)
    ),
)
def trains_nothing(inp: CheckInput) -> Iterator[Hit]:
    steps = _v1_loop(inp)
    if steps is None:
        return
    if steps.epochs <= 0:
        yield Hit(
            "trainer.total_epochs",
            f"trainer.total_epochs={steps.epochs}: fit's loop runs while the epoch (from 0) is "
            f"below it, so verl {inp.version} trains no step",
            fix="set trainer.total_epochs to 1 or more",
        )
        return
    if steps.total is None:
        return
    first = steps.resumed + 1
    if steps.total < first:
        resumed = (
            f", and the run resumes at step {steps.resumed} (trainer.resume_from_path)"
            if steps.resumed
            else ""
        )
        yield Hit(
            "trainer.total_training_steps"
            + (", trainer.resume_from_path" if steps.resumed else ""),
            f"trainer.total_training_steps={steps.total}{resumed}: fit's loop runs while the step "
            f"(from {first}) is at most {steps.total}, so verl {inp.version} trains no step",
            fix=f"set trainer.total_training_steps to {first} or more",
        )


def _reach(steps: Steps) -> str:
    """How far the loop goes, as the rules say it."""
    if steps.total is not None and steps.at_most == steps.total:
        return f"trainer.total_training_steps={steps.total}"
    return (
        f"at most {steps.at_most} steps (data.train_max_samples // data.train_batch_size = "
        f"{steps.per_epoch_at_most} an epoch × {steps.epochs} epochs)"
    )


def _bound_keys(steps: Steps) -> str:
    if steps.total is not None and steps.at_most == steps.total:
        return "trainer.total_training_steps"
    return "data.train_max_samples"


@check(
    "run.profile-step-unreached",
    level="warning",
    evidence=(
        f"{_TRAINER_BASE}:434-437 and :1295-1298 (a step is profiled when it is in "
        "global_profiler.steps), :429 and :443 (the steps fit takes)"
    ),
    summary="A step listed in global_profiler.steps that the run never takes (before step 1, "
    "at or before a resumed step, past the last step): it is never profiled; when none is "
    "taken, the profiler never starts.",
    fix="list steps the run takes",
    example=Example(
        fires=("trainer.total_training_steps=100", "global_profiler.steps=[1,150]"),
        twin=("trainer.total_training_steps=100", "global_profiler.steps=[1,100]"),
    ),
)
def profile_step_unreached(inp: CheckInput) -> Iterator[Hit]:
    steps = _v1_loop(inp)
    listed = inp.resolved.get("global_profiler", {}).get("steps")
    if steps is None or not isinstance(listed, list) or steps.epochs <= 0:
        return
    first, last = steps.resumed + 1, steps.at_most
    if last is not None and last < first:
        return  # run.trains-nothing says it
    numbers = [n for n in (_int(step) for step in listed) if n is not None]
    before = [n for n in numbers if n < first]
    after = [n for n in numbers if last is not None and n > last]
    if not before and not after:
        return
    said = []
    if before:
        said.append(f"{before} before the first step, {first}")
    if after:
        said.append(f"{after} past the last ({_reach(steps)})")
    none = len(before) + len(after) == len(numbers)
    ending = "the profiler never starts" if none else "those steps are never profiled"
    keys = ["global_profiler.steps"]
    if after:
        keys.append(_bound_keys(steps))
    if before and steps.resumed:
        keys.append("trainer.resume_from_path")
    yield Hit(
        ", ".join(keys),
        f"global_profiler.steps lists {'; '.join(said)}: verl {inp.version} profiles a step only "
        f"when fit takes it, so {ending}",
        fix=f"list steps from {first}"
        + (f" to {last}" if last is not None else "")
        + " in global_profiler.steps",
    )


@check(
    "run.frequency-beyond-run",
    level="warning",
    evidence=(
        f"{_TRAINER_BASE}:457-459 (save when save_freq > 0 and the step is a multiple of it or "
        "the last), :467-468 (validate likewise with test_freq), :443-444 (the steps and the last)"
    ),
    summary="trainer.save_freq or trainer.test_freq above the run's last step: no multiple of it "
    "is ever reached, so the run saves (validates) only at its last step, as with any value "
    "from the last step on.",
    fix="set a frequency within the run's steps, or the run's last step to say so",
    example=Example(
        fires=("trainer.total_training_steps=100", "trainer.save_freq=150"),
        twin=("trainer.total_training_steps=100", "trainer.save_freq=50"),
    ),
)
def frequency_beyond_run(inp: CheckInput) -> Iterator[Hit]:
    found = _training_loop(inp)
    if found is None:
        return
    steps, last = found
    trainer = inp.resolved["trainer"]
    # is_last_step holds at total_training_steps (:444); when that is past what the data set
    # can give, the epochs end the loop first and no step is the last.
    beyond_data = (
        steps.total is not None
        and steps.per_epoch_at_most is not None
        and steps.total > steps.per_epoch_at_most * steps.epochs
    )
    for key, does, never in (
        ("save_freq", "saves a checkpoint", "saves no checkpoint"),
        ("test_freq", "validates", "never validates"),
    ):
        freq = _int(trainer.get(key))
        if freq is None or freq <= 0 or freq <= last:
            continue
        when = (
            f"{never}: no step is the last one (trainer.total_training_steps={steps.total} is "
            f"past the {last} steps the epochs give at most)"
            if beyond_data
            else f"{does} only at its last step"
        )
        yield Hit(
            f"trainer.{key}, {_bound_keys(steps)}",
            f"trainer.{key}={freq} is past the run's last step ({_reach(steps)}): no multiple of "
            f"it is reached, so verl {inp.version} {when}; any value from the last step on does "
            "the same",
            fix=f"set trainer.{key} to at most {last}",
        )


@check(
    "run.actor-never-updates",
    level="warning",
    evidence=(
        f"{_TRAINER_BASE}:582 (the actor updates once trainer.critic_warmup <= the step), "
        ":443 (the steps fit takes)"
    ),
    summary="trainer.critic_warmup past the run's last step: the actor's update never runs, so "
    "the policy is never trained.",
    fix="set trainer.critic_warmup below the run's last step",
    example=Example(
        fires=("trainer.total_training_steps=100", "trainer.critic_warmup=150"),
        twin=("trainer.total_training_steps=100", "trainer.critic_warmup=50"),
    ),
)
def actor_never_updates(inp: CheckInput) -> Iterator[Hit]:
    found = _training_loop(inp)
    if found is None:
        return
    steps, last = found
    warmup = _int(inp.resolved["trainer"].get("critic_warmup"))
    if warmup is None or warmup <= last:
        return
    yield Hit(
        f"trainer.critic_warmup, {_bound_keys(steps)}",
        f"trainer.critic_warmup={warmup} is past the run's last step ({_reach(steps)}): verl "
        f"{inp.version} updates the actor only from step {warmup} on, so the policy is never "
        "trained",
        fix=f"set trainer.critic_warmup to at most {last}",
    )


_FULLY_ASYNC_TRAINER = "verl/experimental/fully_async_policy/fully_async_trainer.py"


@check(
    "run.async-test-freq-zero",
    level="error",
    evidence=(
        f"{_FULLY_ASYNC_TRAINER}:529 (FullyAsyncTrainer.fit, after its last step: "
        "current_param_version % trainer.test_freq, unguarded), :534 (the final checkpoint, "
        "after it); the steps' own validation (:818) and saving (:890) test > 0 first"
    ),
    summary="trainer.test_freq=0 under fully_async_main: the trainer's fit divides by it once "
    "training ends (ZeroDivisionError), before it saves the final checkpoint.",
    fix="set trainer.test_freq=-1 to never validate (or a positive frequency)",
    example=Example(
        base="examples/mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh",
        fires=("trainer.test_freq=0",),
        twin=("trainer.test_freq=-1",),
    ),
)
def async_test_freq_zero(inp: CheckInput) -> Iterator[Hit]:
    if inp.entry_module != FULLY_ASYNC_MODULE:
        return
    if _int(inp.resolved["trainer"].get("test_freq")) != 0:
        return
    yield Hit(
        "trainer.test_freq",
        f"trainer.test_freq=0: verl {inp.version}'s FullyAsyncTrainer.fit ends with "
        "`current_param_version % trainer.test_freq` once training is done, a "
        "ZeroDivisionError before the final checkpoint is saved",
        fix="set trainer.test_freq=-1 to never validate",
    )


# Keys fit reads only when it saves: in _save_checkpoint (trainer_base.py:885-913), whose one call
# is under save_freq > 0 (:457-461). The read census finds no other reader on main_ppo's path.
_SAVING_KEYS = (
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep",
    "trainer.remove_previous_ckpt_in_save",
)


@check(
    "run.no-effect",
    level="warning",
    evidence=(
        f"{_TRAINER_BASE}:457-461 (_save_checkpoint's one call, under save_freq > 0), :895-905 "
        "(the keys it reads); :1280-1284 and :1300-1304 (profile_continuous_steps chooses between "
        "two tests of the step being listed, :434-437 and :1295-1298, both false with no step)"
    ),
    summary="A key the V1 loop reads only on a branch the run never takes: the checkpoint-keeping "
    "keys without saving (trainer.save_freq <= 0), profile_continuous_steps without profiled "
    "steps (global_profiler.steps unset or empty).",
    fix="remove the key, or set what takes its branch",
    example=Example(
        fires=("trainer.save_freq=-1", "trainer.max_actor_ckpt_to_keep=2"),
        twin=("trainer.save_freq=10", "trainer.max_actor_ckpt_to_keep=2"),
    ),
)
def loop_no_effect(inp: CheckInput) -> Iterator[Hit]:
    if _v1_loop(inp) is None:
        return
    explicit = {field_key(field) for field in inp.explicit_fields}
    trainer = inp.resolved["trainer"]
    save_freq = _int(trainer.get("save_freq"))
    if save_freq is not None and save_freq <= 0:
        for key in _SAVING_KEYS:
            if key in explicit:
                yield Hit(
                    f"{key}, trainer.save_freq",
                    f"{key} has no effect: verl {inp.version} reads it only when saving a "
                    f"checkpoint, and trainer.save_freq={save_freq} never saves one",
                    fix=f"remove {key}, or set a positive trainer.save_freq",
                )
    key = "global_profiler.profile_continuous_steps"
    if key in explicit and not inp.resolved.get("global_profiler", {}).get("steps"):
        yield Hit(
            f"{key}, global_profiler.steps",
            f"{key} has no effect: it chooses how verl {inp.version} profiles the listed steps, "
            "and global_profiler.steps lists none",
            fix=f"remove {key}, or list steps in global_profiler.steps",
        )
