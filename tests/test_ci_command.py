"""CI runs the README's test command: .ci/run's pytest line is the one a newcomer reads on the
README's second command line, so what CI checks is what the README promises."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    """The pytest invocation the README's test command ends with (after its set-up steps)."""
    commands = re.findall(r"^`(python3 -m venv .*)`$", (ROOT / "README.md").read_text(), flags=re.M)
    assert len(commands) >= 2, "the README's first lines give two commands: set up and run, set up and test"
    return commands[1].split("&&")[-1].strip()


def test_ci_runs_the_readme_test_command():
    command = readme_test_command()
    assert " -m pytest" in command, command
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if " -m pytest" in line]
    assert ci == [command], f".ci/run runs {ci}, the README says {command!r}"


def test_the_readme_test_command_leaves_the_slow_tests_out():
    assert '-m "not slow"' in readme_test_command()
