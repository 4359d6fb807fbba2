"""Training infrastructure shared by SFT and RL: optimizer, checkpoints, metric writers, signals."""
