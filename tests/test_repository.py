"""The repository holds sources, not what building, running or packaging them leaves behind."""

import re
import subprocess

import pytest

from conftest import REPO

# Build outputs, caches and package files: made from the sources, and stale the moment those change.
ARTEFACT = re.compile(r"(^|/)(_build|__pycache__|\.ipynb_checkpoints|dist|build)/|\.(whl|pyc)$")


def committed_files() -> list[str]:
    """What a commit of the working tree holds: the tracked files still there and the untracked ones not ignored
    (a file deleted but not yet committed is gone)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout (a source archive): no tracked files to check")
    return [name for name in listed.stdout.splitlines() if (REPO / name).exists()]


def test_the_repository_tracks_no_build_artefacts():
    artefacts = [name for name in committed_files() if ARTEFACT.search(name)]
    assert not artefacts, f"build artefacts in the repository (delete them; .gitignore keeps them out): {artefacts}"
