"""A whole run in miniature, every number computed by upstream's own functions: answered in the
oracle process (``--serve``) for the adversarial test of the no-effect claims
(tests/test_no_effect_adversarial.py).

A ``whole_run`` question holds resolved mappings (one configuration with a key at one value each);
the answer holds, per mapping, what each stage of ``STEPS`` training steps computes:

- **advantages**: the trainer's own ``_compute_advantage`` (verl/trainer/ppo/v1/trainer_base.py:1588)
  on a fresh batch each step, through one KL controller for the whole run (built from
  ``algorithm.kl_ctrl`` as trainer_base.py:131 builds it; upstream's method decides whether it
  applies it), with several prompts of several responses, rewards on every response's last token
  and on some others, values, and a KL to the reference that is never 0;
- **actor**: each step's passes (the actor's ``ppo_epochs``, at least two) over two mini-batches of
  that batch: a tiny policy's log-probabilities, ``ppo_loss`` (verl/workers/utils/losses.py:57) and
  its gradient, the engine's clipped ``optimizer_step`` and its scheduler's step
  (fsdp/transformer_impl.py:760, :484); the behaviour policy's log-probabilities differ from the
  policy's (importance ratios from about 0.1 to 10, so every clip and the dual clip bind) and the
  reference is the initial policy, so the KL grows as the policy learns;
- **critic** (when ``need_critic``, verl/trainer/ppo/utils.py:96): the same passes with
  ``value_loss`` (losses.py:147) on the step's returns;
- **schedules**: the actor's and the critic's learning rate at every step of each horizon of
  ``HORIZONS`` (and of ``trainer.total_training_steps`` when set), as the engine builds it;
- **setup**, when the question names a key: the trainer's construction and its data loaders'
  set-up, and that key's value in the configuration the rest of the run reads.

A stage upstream refuses is answered as its error. The inputs (tokens, rewards, noise) come from
one seeded generator per step, the same for every mapping, so two mappings whose answers differ
train differently. The engine's methods run on a stand-in ``self`` for the backends whose engine
derives from ``FSDPEngine`` (the others' optimizers are Megatron's: their stages say so). Asked
for, the answer also holds every name the verl code the runs executed mentions (``KEY_NAMES``):
what the run in miniature can compute from.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import io
import math
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes.tiny_batch import BatchMeta

KIND = "whole_run"
KEY_RUNS = "runs"
# Asked for, every name the code the runs executed mentions (``_names``): what the run in
# miniature can compute from.
KEY_NAMES = "names"
KEY_ERROR = "error"  # a stage upstream refused: its exception, one line
# A question's key naming a key whose value after the trainer's set-up is observed (the set-up
# stage runs only then: it needs the whole configuration).
SETUP = "setup"
# What each actor mini-batch saw, measured here (not upstream's numbers): the smallest and largest
# importance ratio of its tokens and the mean absolute log-ratio to the reference.
WITNESS = "witness"
RATIO_RANGE = "ratio range"
KL_TO_REFERENCE = "kl to reference"
# Stage names of an answer (each maps to its observables, or to {KEY_ERROR: …}).
ADVANTAGES = "advantages"
ACTOR = "actor"
CRITIC = "critic"
ACTOR_SCHEDULE = "actor schedule"
CRITIC_SCHEDULE = "critic schedule"
# What an update stage records of the engine that stepped it: upstream's optimizer_step and
# scheduler (True), or a plain SGD step where the strategy's engine is not FSDP's (False).
KEY_UPSTREAM_OPTIMIZER = "upstream optimizer"

STEPS = 4
PROMPTS = 3
# Responses per prompt are capped: a group's statistics need a few, not hundreds.
MAX_RESPONSES = 4
MINI_BATCHES = 2
MIN_EPOCHS = 2
MAX_EPOCHS = 3
VOCABULARY = 13
# Standard deviations of the log-probability gaps: behaviour policy to policy (exp(±2.3) reaches
# the dual clip's usual 3 to 10 on some tokens) and reference to initial policy.
OFF_POLICY_SPREAD = 0.9
REFERENCE_SPREAD = 0.3
# Horizons of a run whose length is its data set's (unknown here): from one step to thousands, so
# a warm-up from a ratio (``int(ratio × horizon)``) and a cosine's last steps are all reached.
HORIZONS = (1, 2, 3, 4, 7, 10, 25, 64, 100, 333, 1000, 4096)
# A known horizon longer than this is not stepped through (the question says so as an error).
MAX_HORIZON = 50_000
SGD_RATE = 0.05


def observable(value: Any) -> Any:
    """A computed value as plain JSON (tensors as lists of floats, NaN kept as "nan")."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return [observable(part) for part in value.unbind()]
        flat = value.detach().cpu().double().flatten().tolist()
        return [x if math.isfinite(x) else repr(x) for x in flat]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): observable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [observable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((observable(v) for v in value), key=repr)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, type):
        return value.__qualname__
    if value is None or isinstance(value, str | int):
        return value
    if hasattr(value, "__dict__"):
        return {"__class__": type(value).__name__, **observable(vars(value))}
    return repr(value)


# --- the batch of one step ---------------------------------------------------------------


class Rollout:
    """One step's rows: prompts, responses, their groups, rewards and the behaviour policy's
    noise, drawn from the step's own generator."""

    def __init__(self, step: int, n: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(1000 + step)
        self.n = max(1, min(int(n), MAX_RESPONSES))
        self.rows = PROMPTS * self.n
        self.group = [row // self.n for row in range(self.rows)]
        prompt_lengths = torch.randint(2, 5, (self.rows,), generator=generator).tolist()
        response_lengths = torch.randint(2, 10, (self.rows,), generator=generator).tolist()
        self.prompts = [
            torch.randint(0, VOCABULARY, (length,), generator=generator)
            for length in prompt_lengths
        ]
        self.responses = [
            torch.randint(0, VOCABULARY, (length,), generator=generator)
            for length in response_lengths
        ]
        self.scores = []
        for length in response_lengths:
            score = torch.zeros(length)
            spread = torch.randn(length, generator=generator) * 0.3
            keep = torch.rand(length, generator=generator) < 0.3
            score = torch.where(keep, spread, score)
            score[-1] = torch.randn((), generator=generator)
            self.scores.append(score)
        self.off_policy = [
            torch.randn(length, generator=generator) * OFF_POLICY_SPREAD
            for length in response_lengths
        ]
        self.reference_gap = [
            torch.randn(length, generator=generator) * REFERENCE_SPREAD
            for length in response_lengths
        ]
        self.rollout_gap = [
            torch.randn(length, generator=generator) * REFERENCE_SPREAD
            for length in response_lengths
        ]
        # Session keys as V1 gives them, ``{uid}_{session}_{index}`` (v1/utils.py:182).
        self.keys = [f"u{self.group[row]}_{row % self.n}_0" for row in range(self.rows)]

    def sequences(self, rows: list[int]) -> list[Any]:
        import torch

        return [torch.cat([self.prompts[row], self.responses[row]]) for row in rows]


def _nested(parts: list[Any]) -> Any:
    import torch

    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


class TinyPolicy:
    """A bigram policy (token → logits): log-probabilities and entropies of every position of
    each sequence, flat as the engine's unpadded output, position t scoring token t + 1."""

    def __init__(self, outputs: int, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.module = torch.nn.Embedding(VOCABULARY, outputs)
        self.outputs = outputs

    def forward(self, sequences: list[Any]) -> tuple[Any, Any]:
        import torch

        tokens = torch.cat(sequences)
        logits = self.module(tokens)
        if self.outputs == 1:
            return logits.squeeze(-1), None
        following = torch.cat([torch.roll(s, -1) for s in sequences])
        log_probs = torch.log_softmax(logits, -1).gather(-1, following[:, None]).squeeze(-1)
        entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
        return log_probs, entropy

    def per_response(self, flat: Any, sequences: list[Any], responses: list[int]) -> list[Any]:
        """Each sequence's response positions of a flat output (shifted by one, as the engine's
        ``no_padding_2_padding`` slices it)."""
        out = []
        start = 0
        for sequence, length in zip(sequences, responses, strict=True):
            end = start + len(sequence)
            out.append(flat[end - length - 1 : end - 1])
            start = end
        return out


def _as_jagged(flat: Any, sequences: list[Any]) -> Any:
    import torch

    offsets = torch.tensor([0, *torch.tensor([len(s) for s in sequences]).cumsum(0).tolist()])
    return torch.nested.nested_tensor_from_jagged(flat, offsets=offsets)


# --- the stages ----------------------------------------------------------------------------


@contextlib.contextmanager
def _transfer_queue(stored: Any, put: dict[str, Any]) -> Iterator[None]:
    """TransferQueue's get and put on one stored batch (the trainer's only use of it here)."""
    import transfer_queue

    def kv_batch_get(*_: Any, select_fields: Any = (), **__: Any) -> Any:
        return stored.select(*[name for name in select_fields if name in stored.keys()])

    def kv_batch_put(*_: Any, fields: Any = None, **__: Any) -> Any:
        put.update({name: fields[name] for name in fields.keys()})
        return None

    saved = transfer_queue.kv_batch_get, transfer_queue.kv_batch_put
    transfer_queue.kv_batch_get, transfer_queue.kv_batch_put = kv_batch_get, kv_batch_put
    try:
        yield
    finally:
        transfer_queue.kv_batch_get, transfer_queue.kv_batch_put = saved


def _trainer(cfg: Any) -> Any:
    """What ``_compute_advantage`` reads of its trainer: the configuration, and the KL controller
    (built whatever ``use_kl_in_reward`` says; upstream's method decides whether to apply it)."""
    from verl.trainer.ppo import core_algos

    trainer = types.SimpleNamespace(config=cfg)
    with contextlib.suppress(Exception):  # a controller upstream would not build: never applied
        trainer.kl_ctrl_in_reward = core_algos.get_kl_controller(cfg.algorithm.kl_ctrl)
    return trainer


def _advantages(
    trainer: Any,
    rollout: Rollout,
    old: list[Any],
    ref: list[Any],
    values: list[Any],
    with_rollout_log_probs: bool,
) -> dict[str, Any]:
    import torch
    from tensordict import TensorDict
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    rows = range(rollout.rows)
    stored = TensorDict(
        {
            "uid": torch.tensor(rollout.group),
            "response_mask": _nested(
                [torch.ones(len(r), dtype=torch.long) for r in rollout.responses]
            ),
            "rm_scores": _nested(rollout.scores),
            "old_log_probs": _nested(old),
            "ref_log_prob": _nested(ref),
            "values": _nested(values),
        },
        batch_size=[rollout.rows],
    )
    if (
        with_rollout_log_probs
    ):  # the rollout returns them when asked to (rollout.calculate_log_probs)
        stored["rollout_log_probs"] = _nested([old[row] + rollout.rollout_gap[row] for row in rows])
    put: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    compute: Any = PPOTrainer._compute_advantage  # the trainer's own method, on a stand-in self
    with _transfer_queue(stored, put):
        compute(trainer, BatchMeta(rollout.keys), metrics)
    return {"fields": put, "metrics": metrics}


def _loss_batch(
    rollout: Rollout, rows: list[int], fields: dict[str, list[Any]], total_tokens: int
) -> Any:
    """A mini-batch as the engine hands it to a loss (one micro-batch, one rank)."""
    import torch
    from verl.utils import tensordict_utils as tu

    data = tu.get_tensordict(
        {
            "prompts": _nested([rollout.prompts[row] for row in rows]),
            "responses": _nested([rollout.responses[row] for row in rows]),
            "response_mask": _nested(
                [torch.ones(len(rollout.responses[row]), dtype=torch.long) for row in rows]
            ),
            **{name: _nested([values[row] for row in rows]) for name, values in fields.items()},
        }
    )
    tu.assign_non_tensor(
        data, dp_size=1, batch_num_tokens=total_tokens, global_batch_size=len(rows)
    )
    return data


class Learner:
    """A role that learns: its config dataclass, a tiny model, its optimizer, scheduler and
    clipped step as the strategy's engine makes them (FSDPEngine's methods on a stand-in self)."""

    def __init__(self, section: Any, outputs: int, seed: int) -> None:
        import torch
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config.optimizer import build_optimizer

        self.config = omega_conf_to_dataclass(section)
        self.policy = TinyPolicy(outputs, seed)
        optim = self.config.optim
        optim.total_training_steps = (
            STEPS  # the trainer's write of its horizon (trainer_base.py:722-729)
        )
        engine = _engine_class(str(section.strategy))
        self.upstream = engine is not None and str(optim.optimizer_impl) == "torch.optim"
        if self.upstream:
            self.optimizer = build_optimizer(self.policy.module.parameters(), optim)
            self._self = types.SimpleNamespace(
                module=self.policy.module,
                optimizer=self.optimizer,
                optimizer_config=optim,
                _qat_enabled=False,
                rank=1,
            )
            self.scheduler = engine._build_lr_scheduler(self._self, self.optimizer)
            self._step = engine.optimizer_step
        else:
            self.optimizer = torch.optim.SGD(self.policy.module.parameters(), lr=SGD_RATE)
            self.scheduler = None

    def step(self) -> Any:
        """The engine's clipped step (its gradient norm), or a plain one."""
        if self.upstream:
            return self._step(self._self)
        self.optimizer.step()
        return None

    def parameters(self) -> list[Any]:
        return [p.detach().clone() for p in self.policy.module.parameters()]


def _engine_class(strategy: str) -> Any:
    """The language model's engine class the registry builds for ``strategy``, when it derives
    from FSDPEngine (whose scheduler and step run on a stand-in), else None."""
    from verl.workers.engine import EngineRegistry, FSDPEngine

    registered: Any = EngineRegistry._engines.get("language_model", {}).get(strategy) or {}
    classes = [cls for cls in registered.values() if isinstance(cls, type)]
    found = [cls for cls in classes if issubclass(cls, FSDPEngine)]
    return found[0] if found else None


def _mini_batches(rows: int) -> list[list[int]]:
    size = max(1, rows // MINI_BATCHES)
    return [list(range(start, min(rows, start + size))) for start in range(0, rows, size)]


def _update(
    learner: Learner,
    rollout: Rollout,
    epochs: int,
    loss: Callable[[Any, list[Any], list[int]], tuple[Any, Any, Any]],
) -> list[dict[str, Any]]:
    """``epochs`` passes over the step's mini-batches: each one's loss, gradient, metrics, the
    clipped step's norm and the parameters after it; then the scheduler's step."""
    seen = []
    for _ in range(epochs):
        for rows in _mini_batches(rollout.rows):
            learner.optimizer.zero_grad()
            sequences = rollout.sequences(rows)
            value, metrics, witness = loss(learner, sequences, rows)
            value.backward()
            gradients = [
                p.grad.detach().clone()
                for p in learner.policy.module.parameters()
                if p.grad is not None
            ]
            norm = learner.step()
            seen.append(
                {
                    "loss": value,
                    "metrics": metrics,
                    "gradients": gradients,
                    "grad_norm": norm,
                    "parameters": learner.parameters(),
                    WITNESS: witness,
                }
            )
    if learner.scheduler is not None:
        learner.scheduler.step()
        seen.append({"lr": learner.scheduler.get_last_lr()})
    return seen


def _actor_loss(
    rollout: Rollout, fields: dict[str, list[Any]]
) -> Callable[[Any, list[Any], list[int]], tuple[Any, Any, Any]]:
    import torch
    from verl.workers.utils.losses import ppo_loss

    def loss(learner: Any, sequences: list[Any], rows: list[int]) -> tuple[Any, Any, Any]:
        log_probs, entropy = learner.policy.forward(sequences)
        tokens = sum(len(rollout.responses[row]) for row in rows)
        data = _loss_batch(rollout, rows, fields, tokens)
        output = {
            "log_probs": _as_jagged(log_probs, sequences),
            "entropy": _as_jagged(entropy, sequences),
        }
        value, metrics = ppo_loss(learner.config, output, data)
        current = torch.cat(
            learner.policy.per_response(
                log_probs.detach(), sequences, [len(rollout.responses[row]) for row in rows]
            )
        )
        old = torch.cat([fields["old_log_probs"][row] for row in rows])
        ref = torch.cat([fields["ref_log_prob"][row] for row in rows])
        ratio = (current - old).exp()
        witness = {
            RATIO_RANGE: [ratio.min(), ratio.max()],
            KL_TO_REFERENCE: (current - ref).abs().mean(),
        }
        return value, metrics, witness

    return loss


def _critic_loss(
    rollout: Rollout, fields: dict[str, list[Any]]
) -> Callable[[Any, list[Any], list[int]], tuple[Any, Any, Any]]:
    from verl.workers.utils.losses import value_loss

    def loss(learner: Any, sequences: list[Any], rows: list[int]) -> tuple[Any, Any, Any]:
        values, _ = learner.policy.forward(sequences)
        tokens = sum(len(rollout.responses[row]) for row in rows)
        data = _loss_batch(rollout, rows, fields, tokens)
        value, metrics = value_loss(learner.config, {"values": _as_jagged(values, sequences)}, data)
        return value, metrics, {}

    return loss


def _schedules(section: Any, known: int | None) -> dict[str, list[float]]:
    """The learning rate at every step of each horizon, as the strategy's engine schedules it."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config.optimizer import build_optimizer

    engine = _engine_class(str(section.strategy))
    if engine is None:
        raise NotImplementedError(f"no FSDP engine schedules strategy {section.strategy!r}")
    if known is not None and known > MAX_HORIZON:
        raise NotImplementedError(f"a schedule of {known} steps is not stepped through")
    optim = omega_conf_to_dataclass(section.optim)
    out = {}
    for horizon in sorted({*HORIZONS, *([known] if known else [])}):
        optim.total_training_steps = horizon
        optimizer = build_optimizer(torch.nn.Linear(1, 1).parameters(), optim)
        scheduler = engine._build_lr_scheduler(
            types.SimpleNamespace(optimizer_config=optim, rank=1), optimizer
        )
        rates: list[float] = []
        for _ in range(horizon):
            rates.extend(float(rate) for rate in scheduler.get_last_lr())
            scheduler.step()
        out[str(horizon)] = rates
    return out


def _stage(
    out: dict[str, Any], name: str, compute: Callable[[], Any], *, observed: bool = True
) -> Any:
    """Run one stage into ``out[name]``: its value (or, not ``observed``, that it ran: a set-up's
    objects hold the configuration itself, which differs whenever the key does), or upstream's
    refusal as an error."""
    try:
        value = compute()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        out[name] = {KEY_ERROR: f"{type(exc).__name__}: {first}"}
        return None
    out[name] = observable(value) if observed else True
    return value


def run(mapping: Mapping[str, Any], setup: str | None = None) -> dict[str, Any]:
    """Every stage's observables on one resolved mapping (see the module's docstring); with
    ``setup`` (a key), the trainer's set-up too, and the key's value after it."""
    from omegaconf import OmegaConf
    from verl.trainer.distillation import is_distillation_enabled
    from verl.trainer.ppo.utils import need_critic

    cfg = OmegaConf.create(dict(mapping))
    out: dict[str, Any] = {}
    arr = cfg.actor_rollout_ref
    known = cfg.trainer.get("total_training_steps")
    known = int(known) if known is not None else None
    with_critic = _stage(out, "needs critic", functools.partial(need_critic, cfg))
    actor = _stage(
        out, "actor setup", functools.partial(Learner, arr.actor, VOCABULARY, 0), observed=False
    )
    if bool(is_distillation_enabled(cfg.get("distillation"))):
        actor = None  # its loss needs the teacher's outputs (engine_workers.py:632-635)
    critic = None
    if with_critic:
        section = cfg.critic.copy()
        section.model.pop("_target_", None)  # the model's files are never read here
        critic = _stage(
            out, "critic setup", functools.partial(Learner, section, 1, 1), observed=False
        )
    miniature = Miniature(cfg, actor, critic)
    for step in range(STEPS):
        miniature.step(step, out)
    for name, learner in ((ACTOR, actor), (CRITIC, critic)):
        if learner is not None:
            out[f"{name} {KEY_UPSTREAM_OPTIMIZER}"] = learner.upstream
    _stage(out, ACTOR_SCHEDULE, functools.partial(_schedules, arr.actor, known))
    if with_critic:
        _stage(out, CRITIC_SCHEDULE, functools.partial(_schedules, cfg.critic, known))
    if setup is not None:
        _stage(out, SETUP, functools.partial(_setup, mapping, setup))
    return out


def _epochs(section: Any) -> int:
    """The passes over each step's batch: the section's ``ppo_epochs``, at least ``MIN_EPOCHS``
    (a later pass sees the ratios the first one moved) and at most ``MAX_EPOCHS``."""
    return max(MIN_EPOCHS, min(int(section.get("ppo_epochs", 1) or 1), MAX_EPOCHS))


class Miniature:
    """The run's state across steps: the learners, the frozen reference and the trainer."""

    def __init__(self, cfg: Any, actor: Learner | None, critic: Learner | None) -> None:
        self.cfg, self.actor, self.critic = cfg, actor, critic
        self.reference = TinyPolicy(VOCABULARY, seed=0)  # the initial policy, frozen
        self.trainer = _trainer(cfg)
        rollout = cfg.actor_rollout_ref.rollout
        self.n = int(rollout.n)
        self.rollout_log_probs = bool(rollout.get("calculate_log_probs", False))

    def step(self, step: int, out: dict[str, Any]) -> None:
        """One training step: the behaviour policy's and reference's log-probabilities and the
        values of a fresh batch, its advantages, then each learner's passes over it."""
        import torch

        rollout = Rollout(step, self.n)
        rows = list(range(rollout.rows))
        sequences = rollout.sequences(rows)
        lengths = [len(r) for r in rollout.responses]
        policy = self.actor.policy if self.actor is not None else self.reference
        with torch.no_grad():
            current = policy.per_response(policy.forward(sequences)[0], sequences, lengths)
            initial = self.reference.per_response(
                self.reference.forward(sequences)[0], sequences, lengths
            )
            values = (
                self.critic.policy.per_response(
                    self.critic.policy.forward(sequences)[0], sequences, lengths
                )
                if self.critic is not None
                else [torch.zeros(length) for length in lengths]
            )
        old = [current[row] + rollout.off_policy[row] for row in rows]
        ref = [initial[row] + rollout.reference_gap[row] for row in rows]
        computed = _stage(
            out,
            f"{ADVANTAGES} {step}",
            functools.partial(
                _advantages, self.trainer, rollout, old, ref, values, self.rollout_log_probs
            ),
        )
        fields: dict[str, list[Any]] = {"old_log_probs": old, "ref_log_prob": ref, "values": values}
        put = computed["fields"] if computed else {}
        for name in ("advantages", "returns", "rollout_is_weights"):
            if name in put:
                fields[name] = list(put[name].unbind())
        if "advantages" not in fields:  # the advantages failed: the losses still see some
            fields["advantages"] = [score.cumsum(0).flip(0) for score in rollout.scores]
            fields["returns"] = fields["advantages"]
        if self.actor is not None:
            loss = _actor_loss(rollout, _only(fields, ACTOR))
            epochs = _epochs(self.cfg.actor_rollout_ref.actor)
            _stage(
                out,
                f"{ACTOR} {step}",
                functools.partial(_update, self.actor, rollout, epochs, loss),
            )
        if self.critic is not None:
            loss = _critic_loss(rollout, _only(fields, CRITIC))
            epochs = _epochs(self.cfg.critic)
            _stage(
                out,
                f"{CRITIC} {step}",
                functools.partial(_update, self.critic, rollout, epochs, loss),
            )


def _setup(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The trainer's construction for the mode (``get_trainer_cls``, ``PPOTrainer.__init__``: the
    KL controller, the replay buffer) and its data loaders' set-up (``_init_dataloader``,
    trainer_base.py:653-731), in the probes' sandbox (``trainer.ray_free``: stand-in data sets
    and loaders, no user file read): what they build, and ``key``'s value in the configuration
    the rest of the run reads."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls

    from pytest_verl_compat.upstream.probes import trainer as trainer_probe

    cfg = OmegaConf.create(dict(mapping))
    with trainer_probe.ray_free(mapping):
        trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(config=cfg)
        trainer.tokenizer = trainer.processor = None  # handed to the stand-in data set only
        trainer._init_dataloader()
    return {
        "replay buffer": trainer.replay_buffer,
        "train loader": trainer.train_dataloader,
        "validation loader": trainer.val_dataloader,
        "total training steps": trainer.total_training_steps,
        "steps per epoch": trainer.steps_per_epoch,
        "value after set-up": OmegaConf.select(trainer.config, key),
    }


def _only(fields: dict[str, list[Any]], role: str) -> dict[str, list[Any]]:
    """The fields each loss is handed (the engine's batch for the role)."""
    wanted = (
        ("old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights")
        if role == ACTOR
        else ("values", "returns")
    )
    return {name: fields[name] for name in wanted if name in fields}


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """The runs of a question; with ``KEY_NAMES`` true, every name their executed code mentions
    too (watching every call costs a third more)."""
    runs, names = [], set()
    for mapping in request["mappings"]:
        watched: contextlib.AbstractContextManager[set[Any]] = (
            _executed() if request.get(KEY_NAMES) else contextlib.nullcontext(set())
        )
        with (
            contextlib.redirect_stdout(io.StringIO()),
            warnings.catch_warnings(),
            watched as executed,
        ):
            warnings.simplefilter("ignore")
            runs.append(run(mapping, request.get(SETUP)))
        names |= _names(executed)
    return {KEY_RUNS: runs, KEY_NAMES: sorted(names)}


# verl's code whose running does not compute training's numbers: the config classes' conversion
# and checks (every field's name appears there).
_NOT_TRAINING = ("verl/workers/config/", "verl/base_config.py", "verl/utils/config.py")


@contextlib.contextmanager
def _executed() -> Iterator[set[Any]]:
    """The code objects of verl's functions called meanwhile (but the config classes')."""
    import sys

    import verl

    root = str(Path(verl.__file__).resolve().parent.parent) + "/"
    skipped = tuple(root + prefix for prefix in _NOT_TRAINING)
    codes: set[Any] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            filename = frame.f_code.co_filename
            if filename.startswith(root + "verl/") and not filename.startswith(skipped):
                codes.add(frame.f_code)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield codes
    finally:
        sys.setprofile(previous)


def _names(codes: set[Any]) -> set[str]:
    """Every attribute name and string the code mentions (nested functions too), with the code
    of each other function of a registry one of them was looked up in (a module's dict of
    functions: ``POLICY_LOSS_REGISTRY``, core_algos.py:50): the code another name runs."""
    import sys

    todo = list(codes)
    for code in codes:
        module = sys.modules.get(_module_of(code))
        for value in vars(module).values() if module is not None else ():
            if isinstance(value, dict) and any(
                getattr(f, "__code__", None) is code for f in value.values()
            ):
                todo.extend(f.__code__ for f in value.values() if hasattr(f, "__code__"))
    names: set[str] = set()
    seen: set[Any] = set()
    while todo:
        code = todo.pop()
        if code in seen:
            continue
        seen.add(code)
        names.update(code.co_names)
        for constant in code.co_consts:
            if isinstance(constant, str) and constant.isidentifier():
                names.add(constant)
            elif hasattr(constant, "co_names"):
                todo.append(constant)
    return names


def _module_of(code: Any) -> str:
    import verl

    root = Path(verl.__file__).resolve().parent.parent
    try:
        relative = Path(code.co_filename).resolve().relative_to(root)
    except ValueError:
        return ""
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
