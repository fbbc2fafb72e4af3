"""Pure array math for RL post-training (filled in by the dew-rl modules)."""
