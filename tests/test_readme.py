"""The README's two set-up commands exist, and .ci/run runs the test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)]


def test_readme_has_exactly_two_setup_commands() -> None:
    blocks = _bash_blocks((REPO / "README.md").read_text())
    assert len(blocks) == 2
    main_job, tests = blocks
    for command in blocks:
        assert "\n" not in command
        assert "pip install torch==2.13.0 &&" in command  # torch first, so no CUDA build is pulled in
    assert "examples/train_resume.py" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    tests_command = _bash_blocks((REPO / "README.md").read_text())[1]
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert tests_command in ci_lines
