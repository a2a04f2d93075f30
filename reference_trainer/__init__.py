"""An independent reference implementation of verl's RL math: advantages, losses, KL, log-probs."""
