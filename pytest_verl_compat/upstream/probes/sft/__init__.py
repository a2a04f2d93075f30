"""The SFT trainer's probes (``verl.trainer.sft_trainer`` under torchrun): ``phases`` runs them in
``run_sft``'s order, ``trainer`` its construction, ``model`` the stand-in model its engine builds,
``step`` the first step, ``effects`` and ``keys`` the keys without effect and a failure's keys."""
