"""Which commit and repository a launch installs on the workers: by default this
checkout's HEAD and its ``origin``, so what runs there is what you have here."""

from __future__ import annotations

import subprocess
import sys

from launch.training import REPO_ROOT
from t5x_like.errors import UserError


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                          check=False)


def launched_commit(commit: str | None) -> str:
    if commit:
        return commit
    head = _git("rev-parse", "HEAD")
    if head.returncode:
        raise UserError("Cannot read this checkout's commit (is it a git clone?); pass "
                        "--commit=SHA and --repo=URL.")
    sha = head.stdout.strip()
    if _git("status", "--porcelain", "--untracked-files=no").stdout.strip():
        print("note: this checkout has uncommitted changes; the workers get commit "
              f"{sha[:12]} without them.", file=sys.stderr)
    if not _git("branch", "-r", "--contains", sha).stdout.strip():
        print(f"note: commit {sha[:12]} is on no remote branch here; push it, or the workers "
              "cannot fetch it.", file=sys.stderr)
    return sha


def launched_repo(repo: str | None) -> str:
    if repo:
        return repo
    origin = _git("remote", "get-url", "origin")
    if origin.returncode or not origin.stdout.strip():
        raise UserError("This checkout has no 'origin' remote to clone on the workers; pass "
                        "--repo=URL (an https:// URL the workers can read).")
    return origin.stdout.strip()
