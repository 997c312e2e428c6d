"""The README's first code block holds exactly the two commands, and .ci/run runs the second."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (REPO / "README.md").read_text()
    block = text.split("```", 2)[1]
    lines = [line for line in block.splitlines()[1:] if line.strip()]
    return lines


def test_readme_block_has_two_commands_pinning_torch_first():
    lines = readme_commands()
    assert len(lines) == 2
    for line in lines:
        assert line.index("torch==2.13.0") < line.index("-e ")


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci
