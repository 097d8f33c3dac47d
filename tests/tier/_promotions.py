"""Counting the local tier's "promoted to" INFO lines in a rank process: proof of which path a
durable save took."""

from __future__ import annotations

import logging


class Promotions(logging.Handler):
    """Attached to ``snapshotkit.manager`` (at INFO) when made; ``count`` is the promotions so far."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        logger = logging.getLogger("snapshotkit.manager")
        logger.addHandler(self)
        logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "promoted to" in record.getMessage()
