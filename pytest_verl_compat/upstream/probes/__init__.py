"""Upstream's own code, run on one configuration up to its first update (oracle process only).

The probes call verl 0.9.0's own functions and constructors in the order ``main_ppo`` meets them:

1. ``config_load``: ``validate_config`` and each config dataclass the selected path converts;
2. ``trainer``: ``get_trainer_cls``, ``PPOTrainer.__init__`` and ``_setup``, which builds the
   tokenizer, the data loaders' batch arithmetic, the critic's and the actor's workers with their
   engines and data-parallel meshes (``boundary.laptop``: rank 0 of the configuration's world,
   no GPU, no Ray, no model files), the reward manager and the checkpoint resume;
3. ``first_step``: each constructed worker's log-prob pass and update on the first step's rows
   (on a Megatron engine also its own micro-batch checks, ``megatron_step``), the losses, and
   ``PPOTrainer.step`` up to the data set's loader.

Every read of the configuration is recorded (``recorder``), so a failure names the keys read on
the lines that decided it; ``records`` keeps one record per failure and one note per step that
could not run here. Runs only inside ``oracle_process`` (``python -I -m`` in an empty folder),
only on a mapping whose every ``_target_`` the installed tree names.
"""

from __future__ import annotations

from pytest_verl_compat.upstream.probes.records import (
    KEY_ADMITTED,
    KEY_EFFECTS,
    KEY_NOT_EVALUATED,
    KEY_NOTES,
    KEY_PATH,
    KEY_RAN,
    KEY_TYPES,
)

__all__ = [
    "KEY_ADMITTED",
    "KEY_EFFECTS",
    "KEY_NOTES",
    "KEY_NOT_EVALUATED",
    "KEY_PATH",
    "KEY_RAN",
    "KEY_TYPES",
]
