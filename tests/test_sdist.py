"""The source distribution carries every file of the repository, and its tests run from it.

Built with `python -m build --sdist` (isolated, as a packager would), unpacked, compared
with the files git tracks, and a few test files that read the docs, the README, the CI
script and the observability files are run from the unpacked tree.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("build")

REPO = Path(__file__).resolve().parent.parent
# Files git tracks that an sdist needs not carry.
NOT_SHIPPED = {".gitignore"}
FROM_THE_SDIST = [
    "tests/test_docs.py",
    "tests/test_readme.py",
    "tests/test_config.py",
    "tests/test_observability.py",
    "tests/test_launchd.py",
]


def tracked_files() -> set[str] | None:
    if not (REPO / ".git").exists():
        return None  # this run is itself from an unpacked sdist
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
    )
    return set(listed.stdout.splitlines()) - NOT_SHIPPED


def test_sdist_holds_the_repository_and_its_tests_pass_from_it(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [archive] = tmp_path.glob("opencode_loop_monitor-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    root = tmp_path / archive.name.removesuffix(".tar.gz")
    assert {"LICENSE", "monitor/py.typed", ".ci/run", "tests/conftest.py"} <= names
    tracked = tracked_files()
    if tracked is not None:
        assert sorted(tracked - names) == []
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]

    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FROM_THE_SDIST],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    # The tests imported the unpacked code, not the checkout's.
    where = subprocess.run(
        [sys.executable, "-c", "import monitor; print(monitor.__file__)"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert where.stdout.strip() == str(root / "monitor" / "__init__.py")
