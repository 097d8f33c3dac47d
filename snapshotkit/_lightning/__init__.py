"""Internals of :mod:`snapshotkit.lightning`: a Lightning checkpoint dict as app state and back."""
