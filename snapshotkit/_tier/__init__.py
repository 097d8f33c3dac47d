"""The fast-recovery tier: each rank's snapshots on its node's local storage, copies on peer nodes.

Read in pipeline order: :mod:`.nodes` (which node each rank runs on, where replicas go),
:mod:`.local` (a node's local root: layout, listing, retention), :mod:`.transfer` (moving a
committed copy between ranks over the process group), :mod:`.agreement` (the step every rank can
restore, and from which copy). :class:`~snapshotkit.manager.SnapshotManager` drives them.
"""
