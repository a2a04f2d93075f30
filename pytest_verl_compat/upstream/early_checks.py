"""Upstream's own config-only checks, run early: inside the oracle process, on one resolved mapping.

Runs only in ``oracle_process`` (``python -I -m`` in an empty folder, verl imported once), and
only on a mapping whose every ``_target_`` the installed tree names. Each check is its own try, so
one failure never hides the next; each failure becomes a record with upstream's message, the
upstream ``file:line`` that raised it (the deepest traceback frame inside the verl package) and
the phase at which 0.9.0 raises it:

- ``trainer start: validate_config`` — upstream's ``validate_config`` (``validate.py`` stand-ins);
- ``config load: <Dataclass>.__post_init__`` — upstream's ``omega_conf_to_dataclass`` on every
  section the selected path converts (actor, ref, rollout, critic, checkpoint engine, profiler,
  distillation, the reward model's rollout), where 0.9.0 converts it;
- ``worker start`` / ``first update`` — the assertions of ``ActorRolloutRefWorker.init_model``
  and ``TrainingWorker.train_mini_batch`` that read only the configuration. Those lines sit inside
  methods that need ``torch.distributed`` and a model, so each is a labelled stand-in that names
  the upstream statement it repeats; the line is looked up in the installed source, and a stand-in
  whose statement is no longer there says so instead of citing a stale line. Where upstream's code
  is a separable function (``make_iterator``, ``prepare_micro_batches``,
  ``_get_required_batch_multiple``), upstream's own function is called.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.roles import model_parallel_sizes, need_critic, reference_worker

# JSON keys of one failure record (they travel from the oracle process to the caller's cache).
KEY_PHASE = "phase"
KEY_MESSAGE = "message"
KEY_WHERE = "where"
KEY_SOURCE = "source"
KEY_STAND_IN = "stand_in"
KEY_CHECK = "check"  # the upstream function that raised, or "stand-in"
VALIDATE_CONFIG = "validate_config"

TRAINER_START = "trainer start: validate_config"
WORKER_START = "worker start: ActorRolloutRefWorker.init_model"
REWARD_MODEL_START = "worker start: RolloutReplica.__init__ (reward model)"
FIRST_UPDATE = "first update"
FIRST_LOG_PROB = "first step: compute_log_prob"  # the log-prob pass before the update

ENGINE_WORKERS = "verl/workers/engine_workers.py"
# The upstream statements the stand-ins repeat, as they read in ENGINE_WORKERS.
DYNAMIC_AGREES = (
    "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz"
)
ROLLOUT_MESH = "assert self.world_size % infer_world_size == 0"
MINI_OVER_DP = "assert mini_batch_size % self.engine.get_data_parallel_size() == 0"


def _set_assertion(section: str, key: str) -> str:
    return f"assert self.config.{section}.{key} is not None"


SET_ASSERTIONS = tuple(
    _set_assertion(section, key)
    for section, key in (
        ("rollout", "log_prob_max_token_len_per_gpu"),
        ("actor", "ppo_max_token_len_per_gpu"),
        ("rollout", "log_prob_micro_batch_size_per_gpu"),
        ("actor", "ppo_micro_batch_size_per_gpu"),
    )
)
STAND_IN_STATEMENTS = (DYNAMIC_AGREES, ROLLOUT_MESH, MINI_OVER_DP, *SET_ASSERTIONS)

STAND_INS = (
    "worker-start and first-update assertions inside methods that need torch.distributed and a "
    "model: repeated from the named upstream statement (its line looked up in the installed source)",
    "data-parallel size: GPUs / the engine's model-parallel product (the device mesh needs "
    "torch.distributed)",
    "the model section (HFModelConfig) is not converted: it loads the model's files",
    "the batch a first update sees: train_batch_size × rollout.n, padded as V1's "
    "_get_required_batch_multiple pads it (repeated: its module imports transfer_queue); rows are "
    "placeholders, only their count matters",
)


def _verl_root() -> Path:
    import verl

    return Path(verl.__file__).resolve().parent


def _relative(filename: str, root: Path) -> str | None:
    try:
        return "verl/" + Path(filename).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def _source_line(where: str) -> str:
    path, _, line = where.rpartition(":")
    try:
        text = (_verl_root().parent / path).read_text(encoding="utf-8").splitlines()
        return text[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return ""


def _message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    return text.splitlines()[0] if text else type(exc).__name__


def _deepest_verl_frame(exc: BaseException) -> tuple[str, str]:
    """(``verl/…:line``, the function's qualified owner) of the deepest frame inside verl."""
    root = _verl_root()
    where, owner = "", ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        relative = _relative(frame.f_code.co_filename, root)
        if relative is None:
            continue
        where = f"{relative}:{line}"
        self = frame.f_locals.get("self")
        name = frame.f_code.co_name
        owner = f"{type(self).__name__}.{name}" if self is not None else name
    return where, owner


def _unwrap(exc: BaseException) -> BaseException:
    # Hydra's instantiate wraps what a dataclass raised; its first line names only the class.
    while type(exc).__name__ == "InstantiationException" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def failure(phase: str, exc: BaseException, check: str) -> dict[str, str]:
    """One record for an exception upstream's own code raised in ``check``."""
    cause = _unwrap(exc)
    where, owner = _deepest_verl_frame(cause)
    if not where:  # raised by the generated __init__ a wrapper called: the wrapper's verl frame
        where, owner = _deepest_verl_frame(exc)
    exc = cause
    if owner.endswith(".__post_init__") and phase != TRAINER_START:
        phase = f"config load: {owner} ({phase})"
    return {
        KEY_PHASE: phase,
        KEY_MESSAGE: _message(exc),
        KEY_WHERE: where,
        KEY_SOURCE: _source_line(where) if where else "",
        KEY_STAND_IN: "",
        KEY_CHECK: check,
    }


@functools.lru_cache(maxsize=64)
def statement_line(relative: str, statement: str) -> int | None:
    """The line of ``statement`` in the installed upstream file, or None when it is gone."""
    try:
        lines = (_verl_root().parent / relative).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for number, text in enumerate(lines, start=1):
        if text.strip().startswith(statement):
            return number
    return None


def stand_in_failure(phase: str, relative: str, statement: str, message: str) -> dict[str, str]:
    """A record for an upstream statement repeated here (it sits in code that needs a GPU)."""
    line = statement_line(relative, statement)
    if line is None:
        return {
            KEY_PHASE: phase,
            KEY_MESSAGE: message,
            KEY_WHERE: "",
            KEY_SOURCE: statement,
            KEY_STAND_IN: f"stale stand-in: {relative} no longer holds {statement!r}",
            KEY_CHECK: "stand-in",
        }
    return {
        KEY_PHASE: phase,
        KEY_MESSAGE: message,
        KEY_WHERE: f"{relative}:{line}",
        KEY_SOURCE: statement,
        KEY_STAND_IN: "repeated here: the statement runs where a model and torch.distributed exist",
        KEY_CHECK: "stand-in",
    }


class _Collector:
    """Runs each check in its own try; keeps each distinct failure once, first phase first."""

    def __init__(self) -> None:
        self.records: list[dict[str, str]] = []

    def add(self, record: dict[str, str]) -> None:
        same = (record[KEY_WHERE], record[KEY_MESSAGE])
        if not any((r[KEY_WHERE], r[KEY_MESSAGE]) == same for r in self.records):
            self.records.append(record)

    def run(self, phase: str, check: Callable[[], Any], name: str) -> Any:
        printed = io.StringIO()
        try:
            with (
                contextlib.redirect_stdout(printed),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore")
                return check()
        except Exception as exc:
            record = failure(phase, exc, name)
            if not record[KEY_WHERE]:
                raise  # not raised by upstream's code: a bug here, never a finding
            self.add(record)
            return None


def _critic_stand_in(critic: Any) -> None:
    # As validate.py: without its _target_, the critic's model section stays a plain mapping
    # instead of an HFModelConfig that reads the model's files.
    if not os.path.isdir(str(critic.model.path)):
        critic.model.pop("_target_", None)


def _ref_as_init_model_builds_it(arr: Any) -> Any:
    """``config.ref`` as ``init_model`` rewrites it before converting it (engine_workers.py)."""
    from omegaconf import open_dict

    ref = arr.ref.copy()
    with open_dict(ref):
        ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


def _conversions(out: _Collector, cfg: Any, plain: Mapping[str, Any]) -> Any:
    """omega_conf_to_dataclass on each section the selected path converts; the rollout config."""
    from verl.trainer.distillation.losses import is_distillation_enabled
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.profiler import ProfilerConfig

    arr = cfg.actor_rollout_ref
    out.run(TRAINER_START, lambda: omega_conf_to_dataclass(arr.actor), "omega_conf_to_dataclass")
    if need_critic(plain):
        critic = cfg.critic.copy()
        _critic_stand_in(critic)
        out.run(TRAINER_START, lambda: omega_conf_to_dataclass(critic), "omega_conf_to_dataclass")
    out.run(
        WORKER_START,
        lambda: omega_conf_to_dataclass(arr.actor.get("profiler", {}), ProfilerConfig),
        "omega_conf_to_dataclass",
    )
    if reference_worker(plain):
        out.run(
            WORKER_START,
            lambda: omega_conf_to_dataclass(_ref_as_init_model_builds_it(arr)),
            "omega_conf_to_dataclass",
        )
    rollout = out.run(
        WORKER_START, lambda: omega_conf_to_dataclass(arr.rollout), "omega_conf_to_dataclass"
    )
    out.run(
        WORKER_START,
        lambda: omega_conf_to_dataclass(arr.rollout.checkpoint_engine),
        "omega_conf_to_dataclass",
    )
    reward_model = cfg.get("reward", {}).get("reward_model", {})
    if reward_model.get("enable"):
        # RewardModelManager builds one RolloutReplica per server, each converting the reward
        # model's rollout section (workers/rollout/replica.py, RolloutReplica.__init__).
        out.run(
            REWARD_MODEL_START,
            lambda: omega_conf_to_dataclass(reward_model.rollout),
            "omega_conf_to_dataclass",
        )
    distillation = cfg.get("distillation")
    if distillation is not None and distillation.get("enabled"):
        out.run(
            WORKER_START,
            lambda: is_distillation_enabled(omega_conf_to_dataclass(distillation)),
            "omega_conf_to_dataclass",
        )
    return rollout


def _worker_start(out: _Collector, plain: Mapping[str, Any], rollout: Any) -> None:
    """The config-only assertions of ActorRolloutRefWorker.init_model, as stand-ins."""
    arr = plain["actor_rollout_ref"]
    actor, roll = arr["actor"], arr["rollout"]
    if actor["use_dynamic_bsz"] != roll["log_prob_use_dynamic_bsz"]:
        out.add(
            stand_in_failure(
                WORKER_START,
                ENGINE_WORKERS,
                DYNAMIC_AGREES,
                "AssertionError",
            )
        )
    required = (
        [("rollout", "log_prob_max_token_len_per_gpu"), ("actor", "ppo_max_token_len_per_gpu")]
        if actor["use_dynamic_bsz"]
        else [
            ("rollout", "log_prob_micro_batch_size_per_gpu"),
            ("actor", "ppo_micro_batch_size_per_gpu"),
        ]
    )
    for section, key in required:
        if arr[section].get(key) is None:
            out.add(
                stand_in_failure(
                    WORKER_START,
                    ENGINE_WORKERS,
                    _set_assertion(section, key),
                    "AssertionError",
                )
            )
    if rollout is not None:
        world = int(plain["trainer"]["n_gpus_per_node"]) * int(plain["trainer"]["nnodes"])
        infer = (
            rollout.tensor_model_parallel_size
            * rollout.data_parallel_size
            * rollout.pipeline_model_parallel_size
        )
        if infer and world % infer:
            out.add(
                stand_in_failure(
                    WORKER_START,
                    ENGINE_WORKERS,
                    ROLLOUT_MESH,
                    f"AssertionError: rollout world_size: {world} is not divisible by "
                    f"infer_world_size: {infer}",
                )
            )


def _data_parallel(plain: Mapping[str, Any], section: Mapping[str, Any]) -> int:
    world = int(plain["trainer"]["n_gpus_per_node"]) * int(plain["trainer"]["nnodes"])
    product = math.prod(
        max(size, 1)
        for size in model_parallel_sizes({"actor_rollout_ref": {"actor": section}}).values()
    )
    return max(world // product, 1)


def _required_batch_multiple(plain: Mapping[str, Any], dp: int) -> int:
    """Stand-in for V1's ``PPOTrainer._get_required_batch_multiple`` (verl/trainer/ppo/v1/
    trainer_base.py): its module imports ``transfer_queue``, which a CPU install lacks. It pads the
    batch to a multiple of the data-parallel size and of each updated role's mini-batch (× n)."""
    n = int(plain["actor_rollout_ref"]["rollout"]["n"])
    required = dp
    if need_critic(plain):
        required = math.lcm(required, int(plain["critic"]["ppo_mini_batch_size"]) * n)
    # At the first step that updates the actor (critic_warmup <= global_steps), the actor's too.
    actor_mini = int(plain["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]) * n
    return math.lcm(required, actor_mini) if actor_mini > 0 else required


def _first_step_batch(plain: Mapping[str, Any], dp: int) -> int:
    """The rows of the first update's batch: train_batch_size × n, padded as V1 pads it."""
    rows = int(plain["data"]["train_batch_size"]) * int(plain["actor_rollout_ref"]["rollout"]["n"])
    if not plain["trainer"].get("use_v1"):
        return rows
    multiple = _required_batch_multiple(plain, dp)
    return -(-rows // multiple) * multiple if multiple > 0 else rows


def _rows(count: int, **non_tensor: Any) -> Any:
    import torch
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict(
        tensor_dict={"rows": torch.zeros(count, 1)}, non_tensor_dict=dict(non_tensor)
    )


def _updates(plain: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any], str, str]]:
    """(name, section, micro key, dynamic key) of each training role's first update."""
    arr = plain["actor_rollout_ref"]
    yield "actor", arr["actor"], "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"
    if need_critic(plain):
        yield "critic", plain["critic"], "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"


def _first_update(out: _Collector, plain: Mapping[str, Any]) -> None:
    """TrainingWorker.train_mini_batch's checks, make_iterator and the static micro-batch split."""
    n = int(plain["actor_rollout_ref"]["rollout"]["n"])
    actor_dp = _data_parallel(plain, plain["actor_rollout_ref"]["actor"])
    batch = _first_step_batch(plain, actor_dp)
    for name, section, micro_key, dynamic_key in _updates(plain):
        dp = _data_parallel(plain, section)
        if batch % dp:
            continue  # the dispatch splits the batch evenly; validate_config reports this
        mini = int(section["ppo_mini_batch_size"]) * n
        if mini % dp:
            out.add(
                stand_in_failure(
                    f"{FIRST_UPDATE}: TrainingWorker.train_mini_batch ({name})",
                    ENGINE_WORKERS,
                    MINI_OVER_DP,
                    f"AssertionError: Got mini_batch_size={mini} and "
                    f"self.engine.get_data_parallel_size()={dp}",
                )
            )
            continue
        per_gpu = mini // dp
        out.run(
            f"{FIRST_UPDATE}: make_iterator ({name})",
            functools.partial(_iterate, batch // dp, per_gpu),
            "make_iterator",
        )
        micro = section.get(micro_key)
        if not section.get(dynamic_key) and micro is not None and per_gpu:
            out.run(
                f"{FIRST_UPDATE}: prepare_micro_batches ({name} micro-batches)",
                functools.partial(_split, per_gpu, int(micro)),
                "prepare_micro_batches",
            )
    _log_prob_passes(out, plain, batch, actor_dp)


def _iterate(rows: int, mini_batch_size: int) -> None:
    """Upstream's make_iterator over the rows one data-parallel rank holds at the update."""
    from verl.utils import tensordict_utils as tu

    tu.make_iterator(_rows(rows), mini_batch_size, epochs=1, seed=0)


def _split(rows: int, micro_batch_size_per_gpu: int) -> None:
    """Upstream's static micro-batch split (the FSDP and Megatron engines both call it)."""
    from verl.workers.engine.utils import prepare_micro_batches

    prepare_micro_batches(
        _rows(rows, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch_size_per_gpu)
    )


def _log_prob_passes(out: _Collector, plain: Mapping[str, Any], batch: int, dp: int) -> None:
    """The static micro-batch split of the old (and reference) log-prob passes."""
    arr = plain["actor_rollout_ref"]
    if arr["actor"]["use_dynamic_bsz"] or batch % dp:
        return
    passes = [("old log-probs", arr["rollout"].get("log_prob_micro_batch_size_per_gpu"))]
    if reference_worker(plain):
        passes.append(("reference log-probs", arr["ref"].get("log_prob_micro_batch_size_per_gpu")))
    for name, micro in passes:
        if micro is None:
            continue  # worker start asserts it is set
        out.run(
            f"{FIRST_LOG_PROB}: prepare_micro_batches ({name})",
            functools.partial(_split, batch // dp, int(micro)),
            "prepare_micro_batches",
        )


def run_all(mapping: Mapping[str, Any], validate: Callable[[Any], None]) -> list[dict[str, str]]:
    """Every early check on one resolved mapping; ``validate`` runs validate_config on a config."""
    from omegaconf import OmegaConf

    out = _Collector()
    plain = dict(mapping)
    out.run(TRAINER_START, lambda: validate(OmegaConf.create(plain)), VALIDATE_CONFIG)
    cfg = OmegaConf.create(plain)
    rollout = _conversions(out, cfg, plain)
    _worker_start(out, plain, rollout)
    _first_update(out, plain)
    return out.records
