"""Conformance stage: our reference math against upstream verl 0.9.0, values and gradients.

Each case feeds the same seeded inputs to one of our functions (`reference_trainer.math`) and
to upstream's (`verl.trainer.ppo.core_algos`, `verl.workers.utils.losses`) and compares
outputs, metrics and gradients (`torch.autograd.grad` w.r.t. log-probs, values, logits) within
the case's tolerance. Case ids read `<component>.<variant>[<family>-<dtype>]`.

Modules, each importing only the ones before it:
- `plan`: the cases, their ids and tolerances (`corpus/conformance.yaml`), and the advantage
  estimators' table `ESTIMATORS`; imports neither torch nor verl, so collection stays cheap.
- `sft_inputs`: the seeded inputs of verl's SFT loss (`sft_loss`): its no-padding (nested,
  remove-padding) and padded layouts, micro-batches on several ranks.
- `inputs`: each component's seeded inputs (ragged and multi-turn masks, group ids, ...).
- `sft`: both sides of the `sft_loss` component.
- `components`: our side and upstream's side of each component, and our namespace.
- `compare`: the comparator and its failure messages.
- `run`: `run_case`, what the stage calls.

The step stage (whole training steps against verl's engine) is the `step/` subpackage; its
`__init__` says what it holds. This module imports nothing: import from the submodules.
"""
