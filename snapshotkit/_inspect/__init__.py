"""Looking into snapshots without restoring them: the machinery behind ``verify``, ``diff`` and the CLI."""
