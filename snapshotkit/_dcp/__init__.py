"""DCP's storage layer on snapshotkit's pipeline (the work behind :mod:`snapshotkit.dcp`)."""
