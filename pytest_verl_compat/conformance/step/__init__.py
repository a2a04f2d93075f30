"""The step oracle: training steps of the reference trainer against verl's own engine steps.

What the other layers use: `step_cases`/`step_case_ids` (`cases`), `run_steps`,
`run_upstream`, `compare_case`, `case_failures`, `report_json` and `StepOracleError` (`run`),
the plan and its coverage table (`plan`). Modules, each importing only the ones before it:

- `plan`: shapes, variants, tolerances, step-only cases (`corpus/step.yaml`), the coverage table
  (`corpus/step_coverage.yaml`), the settings both sides read, the fixed rollouts; no torch.
- `cases`: the step cases of a session (official, accepted derived, step-only).
- `coverage`: which case moves which leaf, checked against the profile; its README table.
- `upstream_patches`, `upstream`: verl's V1 step on its FSDP engine, in a sandboxed subprocess.
- `memory_states`: the same engine on fake process groups, its per-rank model-state bytes (the
  memory forecast's oracle, tests/test_fit_states.py); the step oracle never imports it.
- `reference`: the reference trainer's steps.
- `compare`, `run`: comparing both, and the report.
- `sft_upstream`, `sft`: the SFT step oracle (verl's SFT trainer steps against ours,
  `corpus/sft_step.yaml`): `load_sft_step_plan`, `run_sft_upstream`, `compare_sft_case`,
  `run_sft_steps`.
"""
