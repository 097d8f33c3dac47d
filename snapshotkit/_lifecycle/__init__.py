"""The lifecycle of a run's snapshots: listing a root, retention, deletion, preemption notices."""
