import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sh\n(.+?)\n```", text, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    install, tests = readme_commands()[:2]
    assert "opencode-loop-monitor watch" in install
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1]
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci_lines
