"""The README's Python API example runs as documented, and its quick start matches CI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make test" in quick_start and "make run" in quick_start
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)


@pytest.mark.real
def test_python_api_example_runs(tmp_path):
    example = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(example)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) >= 3
    assert re.match(r"(stop|length) \d+ tokens in", lines[-2])  # finish reason + stats summary
    float(lines[-1])  # tokens_per_second


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_completes_the_first_run_edit_with_its_stats():
    """``make run`` sends an edit of given code (where drafting has work to do) with --stats,
    whose line ends with the measured speedup; ``PROMPT=...`` still sends the user's own."""
    def dry_run(*args: str) -> str:
        res = subprocess.run(["make", "-n", "run", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert "complete --stats < scripts/first_run_prompt.txt" in dry_run()
    prompt = (ROOT / "scripts" / "first_run_prompt.txt").read_text()
    assert "Return the whole function" in prompt and "```python\ndef " in prompt
    assert 'complete "reverse a list" --stats' in dry_run("PROMPT=reverse a list")
