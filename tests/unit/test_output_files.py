"""Every file gdrprobe writes is written only where a regular file or nothing stands (issue 43
item 1): `check --prometheus PATH` renamed its metrics onto PATH whatever stood there, so as
root a FIFO, a device node or a symbolic link became a regular file, and a prolog given
`--prometheus /dev/null` ("discard the metrics") would have replaced the node's /dev/null.
Special files are made in the test's scratch directory, never under /dev."""

from __future__ import annotations

import os
import stat

import pytest

import gdrprobe
from gdrprobe.cli import main
from gdrprobe.errors import UsageError
from gdrprobe.files import check_output_path, replace_file


@pytest.fixture
def specials(tmp_path):
    """A FIFO, a symbolic link to a regular file, a dangling link, a directory and a socket."""
    import socket

    target = tmp_path / "target"
    target.write_text("kept\n")
    os.mkfifo(tmp_path / "fifo")
    os.symlink(target, tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    (tmp_path / "dir").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    yield tmp_path
    server.close()


KINDS = {"fifo": "a FIFO", "link": "a symbolic link", "dangling": "a symbolic link",
         "dir": "a directory", "sock": "a socket"}


def unchanged(path) -> str:
    """What stands at path, as lstat says."""
    return stat.S_IFMT(os.lstat(path).st_mode)


@pytest.fixture
def nothing_probed(monkeypatch):
    """The API's checks and the sweep, each failing the test if reached."""
    for name in ("check", "check_node", "bench", "cluster"):
        monkeypatch.setattr(gdrprobe, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran"))


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("argv", [["check", "--prometheus"], ["check", "--node", "--prometheus"],
                                  ["bench", "-o"], ["bench", "--csv"], ["bench", "--prometheus"],
                                  ["cluster", "-o"]], ids=" ".join)
def test_an_output_path_that_is_no_regular_file_is_a_usage_error_before_any_probe(
        specials, nothing_probed, capsys, argv, name):
    path = specials / name
    before = unchanged(path)
    assert main([*argv, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path} is {KINDS[name]}" in err and "not a regular file" in err
    assert "nothing was measured" in err and "fix: give" in err
    assert unchanged(path) == before
    assert (specials / "target").read_text() == "kept\n"


def test_a_plot_directory_with_a_fifo_where_a_plot_goes_is_refused(specials, nothing_probed, capsys):
    os.mkfifo(specials / "dir" / "matrix.png")
    assert main(["bench", "--plot", str(specials / "dir")]) == 2
    assert "matrix.png is a FIFO" in capsys.readouterr().err


def test_a_regular_file_or_nothing_is_accepted(tmp_path):
    (tmp_path / "old.prom").write_text("old\n")
    check_output_path(str(tmp_path / "old.prom"), "--prometheus")
    check_output_path(str(tmp_path / "new.prom"), "--prometheus")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_what_stands_there_at_the_rename_is_looked_at_again(specials, name):
    """A FIFO or a link made while the check ran is not replaced either."""
    path = specials / name
    before = unchanged(path)
    with pytest.raises(UsageError, match="not a regular file"):
        replace_file(str(path), b"metrics\n", "--prometheus")
    assert unchanged(path) == before
    assert sorted(os.listdir(specials)) == sorted([*KINDS, "target"])   # no staged file left


def test_a_regular_file_is_replaced_whole_and_readable(tmp_path):
    path = tmp_path / "gdrprobe.prom"
    path.write_text("old\n")
    os.chmod(path, 0o600)
    replace_file(str(path), b"new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644    # the collector reads it
    assert os.listdir(tmp_path) == ["gdrprobe.prom"]


def test_check_writes_its_error_metrics_only_onto_a_regular_file(tmp_path, monkeypatch):
    """A check that failed writes its exit code into --prometheus: refused there too, and the
    check's own error is not hidden by a traceback."""
    pytest.importorskip("prometheus_client")
    from gdrprobe.report.check_metrics import write_check_error

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UsageError, match="is a FIFO"):
        write_check_error(4, str(tmp_path / "fifo"))
    write_check_error(4, str(tmp_path / "gdrprobe.prom"))
    assert "gdrprobe_check_exit_code" in (tmp_path / "gdrprobe.prom").read_text()


# ---- bench --baseline: a file read within bounds (issue 43 item 2) ------------------------


@pytest.mark.parametrize("make, said", [
    (lambda path: os.mkfifo(path), "it is a FIFO, not a regular file"),
    (lambda path: path.mkdir(), "it is a directory, not a regular file"),
    (lambda path: path.write_text("[" * 200_000), "nest more than 64 deep"),
    (lambda path: path.write_text('{"kind": "bench", "rows": [' + "[" * 70 + "]" * 70 + "]}"),
     "nest more than 64 deep"),
    (lambda path: os.symlink(path, path), "Too many levels of symbolic links"),
    (lambda path: path.write_bytes(b"\xff{}"), "cannot read baseline"),
], ids=["fifo", "directory", "deep", "deep-row", "loop", "binary"])
def test_a_baseline_that_is_no_bench_document_is_a_usage_error(tmp_path, make, said):
    from gdrprobe.report.bench import read_baseline

    path = tmp_path / "baseline.json"
    make(path)
    with pytest.raises(UsageError, match="cannot read baseline") as raised:
        read_baseline(str(path))
    assert said in raised.value.cause


def test_a_baseline_past_its_size_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """A device that answers forever (/dev/zero grew to 8.4 GB in 20 s) or a huge file: the
    read stops at the bound (a character device is refused before it is opened)."""
    from gdrprobe.report import bench

    monkeypatch.setattr(bench, "MAX_BASELINE_BYTES", 1000)
    (tmp_path / "big.json").write_text(" " * 2000 + "{}")
    with pytest.raises(UsageError, match="larger than 1000 bytes"):
        bench.read_baseline(str(tmp_path / "big.json"))
    try:
        os.mknod(tmp_path / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        return
    with pytest.raises(UsageError, match="it is a character device, not a regular file"):
        bench.read_baseline(str(tmp_path / "zero"))


# ---- the NIC lock, in a directory every user may write (issue 43 item 2) ------------------


@pytest.mark.parametrize("make", [os.mkfifo, lambda path: os.symlink("/dev/null", path)],
                         ids=["fifo", "link"])
def test_a_fifo_or_a_link_at_a_nic_locks_name_never_blocks_the_check(tmp_path, make):
    """/run/gdrprobe is world-writable and sticky: a FIFO any user made at mlx5_0.lock hung
    the open (a prolog "stuck", the node drained); now the check goes on without the lock
    and says why."""
    import threading

    from gdrprobe.campaign.nic_lock import nic_lock

    (tmp_path / "locks").mkdir()
    make(tmp_path / "locks" / "mlx5_0.lock")
    said = []

    def check():
        with nic_lock("mlx5_0", 0.0, {"GDRPROBE_LOCK_DIR": str(tmp_path / "locks")}) as (held, why):
            said.append((held.path, why))

    checking = threading.Thread(target=check, daemon=True)
    checking.start()
    checking.join(10)
    assert not checking.is_alive(), "opening the lock blocked"
    (path, why), = said
    assert path is None and "set GDRPROBE_LOCK_DIR to a writable directory" in why
