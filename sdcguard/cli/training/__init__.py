"""The training side's commands: its records (incidents, checkpoints, scrubs of checkpoints at rest) and its
launcher."""
