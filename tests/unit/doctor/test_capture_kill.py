"""`capture --replace` killed at every step (SIGKILL in a child process, at points injected
by wrapping the step's function): DEST always holds the earlier capture or the new one,
where the kernel exchanges the two in one step; where it cannot (the fallback renames the
earlier one aside first), a capture killed between the two renames is put back by the next
run. The next run removes every hidden directory the killed one left."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from gdrprobe.doctor import capture as capture_module
from gdrprobe.doctor.capture import capture
from tests.unit.doctor import machines

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHILD_LIMIT_S = 60
# The child: capture DEST from ROOT with replace, SIGKILLed at the point named. argv: point,
# dest, root, "fallback" to take the path without an exchange.
CHILD = r'''
import os, shutil, signal, sys
from gdrprobe.doctor import capture as c

point, dest, root, path = sys.argv[1:5]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
exchange, rename, rmtree, into, copy = c._exchange, os.rename, shutil.rmtree, c._capture_into, c._Copier._file
files = []

def copying(self, *args):
    files.append(args)
    if point == "copying" and len(files) == 5:
        die()
    return copy(self, *args)

def exchanging(first, second):
    if path == "fallback":
        return False
    if point == "before-exchange":
        die()
    swapped = exchange(first, second)
    if point == "after-exchange":
        die()
    return swapped

def renaming(source, target):
    if point == "before-aside":
        die()
    rename(source, target)
    if point == "aside" and source == dest or point == "after-swap" and target == dest:
        die()

def removing(tree, **kwargs):
    if point == "removing":       # part of the earlier capture removed
        for name in sorted(os.listdir(tree))[:2]:
            rmtree(os.path.join(tree, name), ignore_errors=True)
        die()
    rmtree(tree, **kwargs)

def written(*args):
    copied = into(*args)
    if point == "written":
        die()
    return copied

c._Copier._file, c._exchange, os.rename, shutil.rmtree, c._capture_into = (
    copying, exchanging, renaming, removing, written)
c.capture(dest, root=root, environ={}, replace=True)
'''
EXCHANGE_POINTS = ("copying", "written", "before-exchange", "after-exchange", "removing")
FALLBACK_POINTS = ("before-aside", "aside", "after-swap", "removing")


def files(tree: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))


@pytest.fixture
def two_machines(tmp_path):
    """An earlier capture at DEST (of a node with mlx5_0 and mlx5_1) and what a capture of
    the second node (mlx5_0 only) holds."""
    machines.dual_socket_node(tmp_path / "first")
    machines.pix_node(tmp_path / "second", pairs=1)
    capture(str(tmp_path / "expected"), root=str(tmp_path / "second"), environ={})
    dest = tmp_path / "report"
    capture(str(dest), root=str(tmp_path / "first"), environ={})
    return dest, files(dest), files(tmp_path / "expected")


def killed(point: str, dest: pathlib.Path, root: pathlib.Path, path: str) -> int:
    child = subprocess.run([sys.executable, "-c", CHILD, point, str(dest), str(root), path], cwd=ROOT,
                           capture_output=True, text=True, timeout=CHILD_LIMIT_S)
    return child.returncode


def hidden(parent: pathlib.Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if name.startswith("."))


@pytest.mark.parametrize("path, point", [("exchange", point) for point in EXCHANGE_POINTS]
                         + [("fallback", point) for point in FALLBACK_POINTS])
def test_a_capture_killed_at_any_point_leaves_the_old_or_the_new_one(tmp_path, two_machines, path, point):
    if path == "exchange" and not capture_module._exchange(str(tmp_path / "first"), str(tmp_path / "first")):
        pytest.skip("this kernel or file system cannot exchange two paths")
    dest, old, new = two_machines
    assert killed(point, dest, tmp_path / "second", path) == -signal.SIGKILL
    if path == "exchange" or point != "aside":
        assert files(dest) in (old, new)
    else:
        assert not dest.exists()         # between the two renames: the next run puts it back
    assert hidden(tmp_path)              # what the killed run left
    capture_module.recover(str(dest))
    assert files(dest) in (old, new) and hidden(tmp_path) == []
    capture(str(dest), root=str(tmp_path / "second"), environ={}, replace=True)
    assert files(dest) == new and hidden(tmp_path) == []


def test_the_next_run_puts_back_the_capture_a_kill_left_aside_before_it_judges_dest(tmp_path, two_machines):
    """Without --replace, the earlier capture (put back) is refused like any capture."""
    from gdrprobe.errors import UsageError

    dest, old, _ = two_machines
    assert killed("aside", dest, tmp_path / "second", "fallback") == -signal.SIGKILL
    with pytest.raises(UsageError, match="is not empty"):
        capture(str(dest), root=str(tmp_path / "second"), environ={})
    assert files(dest) == old and hidden(tmp_path) == []


def test_what_a_live_capture_holds_is_left_alone(tmp_path, two_machines):
    dest, old, _ = two_machines
    live = tmp_path / ".report.0123abcd"
    live.mkdir()
    lock = capture_module._locked(str(live), capture_module.fcntl.LOCK_EX)
    try:
        capture_module.recover(str(dest))
        assert live.exists()
    finally:
        capture_module._unlock(lock)
    capture_module.recover(str(dest))
    assert not live.exists() and files(dest) == old


def test_links_and_other_names_beside_dest_are_never_touched(tmp_path, two_machines):
    dest, _, _ = two_machines
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / ".report.0123abcd").symlink_to(target)
    (tmp_path / ".report.notours").mkdir()
    (tmp_path / ".report.0123abcd.new").mkdir()
    capture_module.recover(str(dest))
    assert hidden(tmp_path) == [".report.0123abcd", ".report.0123abcd.new", ".report.notours"]
    assert target.exists()
