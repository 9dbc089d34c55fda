"""Files gpuops keeps on this machine while another local user waits for it (issue 35, items 2, 7 and 8;
gpuops/localfiles.py): the ssh master's folder under a temp folder that user made, the crash file, and the
reports written through a temporary beside them.

The other user is a real one (bench/users.py: useradd for this module, userdel after); its folder and links are
made by it. Where users cannot be added here, those tests skip and say why.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import gpuops
from bench.users import OtherUser, UsersUnavailable, shared_folder
from click.testing import CliRunner

from gpuops.localfiles import UnsafeFolder, private_folder
from gpuops.transport.ssh.openssh import argv as sshargv

LOCAL_INV = Path(__file__).resolve().parent.parent / "inventories" / "local.yaml"


@pytest.fixture(scope="module")
def other() -> Iterator[OtherUser]:
    try:
        user = OtherUser.create()
    except UsersUnavailable as exc:
        pytest.skip(f"needs a second local user: {exc}")
    yield user
    user.remove()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may write, sticky as /tmp is."""
    folder = shared_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# -- the folders above a private one (item 2) ------------------------------------------------------


@pytest.mark.parametrize(("top_mode", "parent_owner", "parent_mode", "refused"), [
    (0o755, 4242, 0o777, "gpuops-0 belongs to uid 4242, who could swap"),  # theirs, in a folder of root's
    (0o1777, 4242, 0o700, "gpuops-0 belongs to uid 4242, who could swap"),  # theirs, in a sticky /tmp
    (0o1777, 0, 0o775, "gpuops-0 is writable by its group (mode 0775)"),
    (0o755, 0, 0o1777, "cm belongs to uid 4242"),  # cm itself made by them in a sticky folder
])
def test_a_private_folder_is_refused_where_another_user_could_swap_it(tmp_path: Path, top_mode: int, parent_owner: int,
                                                                     parent_mode: int, refused: str) -> None:
    """OpenSSH's rule for its own files, with /tmp's sticky bit honoured: every folder above is root's or ours and
    only we may rename its entries. (uid 4242 stands for another user: root hands it the folder.)"""
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(top_mode)
    parent = top / "gpuops-0"
    parent.mkdir()
    parent.chmod(parent_mode)
    os.chown(parent, parent_owner, parent_owner)
    if parent_mode & stat.S_ISVTX:
        (parent / "cm").mkdir()
        os.chown(parent / "cm", 4242, 4242)
    with pytest.raises(UnsafeFolder, match=re.escape(refused)):
        private_folder(str(parent / "cm"))


def test_a_link_in_place_of_the_private_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "gpuops-0").mkdir()
    os.symlink(tmp_path, tmp_path / "gpuops-0" / "cm")
    with pytest.raises(UnsafeFolder, match="cm is a symbolic link"):
        private_folder(str(tmp_path / "gpuops-0" / "cm"))


def test_a_private_folder_under_tmp_and_through_a_link_of_ours_is_made_0700(tmp_path: Path) -> None:
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o1777)
    os.symlink(top, tmp_path / "tmplink")
    made = private_folder(str(tmp_path / "tmplink" / "gpuops-0" / "cm"))
    assert made == str(tmp_path / "tmplink" / "gpuops-0" / "cm")
    assert stat.S_IMODE((top / "gpuops-0" / "cm").stat().st_mode) == 0o700


def test_no_folder_short_enough_for_a_socket_means_no_master_not_an_error(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35 item 11: this was exit 2 ("no folder ... short enough"); ssh works without a master."""
    long = tmp_path / ("h" * 90)
    monkeypatch.setenv("HOME", str(long))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(long / "tmp"))
    found = sshargv.control_dir("pve1")
    assert found.path == str(long / ".cache" / "gpuops" / "cm") and not found.sockets
    assert "short enough" in found.why


def test_ssh_files_never_go_under_a_temp_folder_another_user_made(tmp_path: Path, sshd: SshServer,
                                                                  fake_proxmox: FakeProxmox, other: OtherUser,
                                                                  shared: Path) -> None:
    """No XDG_RUNTIME_DIR, a HOME too long for a socket: the master's folder would be $TMPDIR/gpuops-<uid>/cm. The
    other user made $TMPDIR/gpuops-<uid> first (0777), so they could swap `cm` and serve the socket the commands
    (and the launch's env secrets) go to. gpuops puts nothing there, says so, and logs in without a master."""
    theirs = shared / f"gpuops-{os.getuid()}"
    other.run("mkdir", "-m", "0777", str(theirs))
    home = tmp_path / ("h" * 90)
    home.mkdir()
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": "", "TMPDIR": str(shared), "SSH_AUTH_SOCK": ""}
    for _ in range(2):
        result = gpuops("status", "-v", "-i", str(inv), env=env)
        assert result.code == 0 and "ct200: reachable via pve1, container 200 running" in result.text, result
    assert list(theirs.iterdir()) == []  # nothing of gpuops' in a folder another user can rename entries of
    assert f"not {theirs}/cm: {theirs} belongs to user {other.name}" in result.err, result.err
    assert "each command logs in on its own" in result.err
    assert "gpuops: 0 SSH connection(s)" not in result.err  # no master kept between the two: each logged in
    own = home / ".cache" / "gpuops" / "cm"  # ssh's logs: a private folder of any length
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and not list(own.glob("ssh-*.log"))


FAKE_MASTER = """import socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.bind(sys.argv[1])
sock.listen(8)
print("listening", flush=True)
while True:
    conn, _ = sock.accept()
    with open(sys.argv[2], "a") as mark:
        mark.write("a connection\\n")
    conn.close()
"""


def test_a_socket_another_user_serves_at_the_users_controlpath_is_never_used(tmp_path: Path, sshd: SshServer,
                                                                              fake_proxmox: FakeProxmox,
                                                                              other: OtherUser, shared: Path) -> None:
    """The user's ~/.ssh/config puts ControlMaster sockets in a shared folder (`ControlPath /tmp/cm-%C` is a common
    one): the other user listens there first, as a master would. gpuops neither connects to it nor puts its
    own socket there; its own master, in its private folder, carries the commands."""
    sock, mark = shared / "cm-pve", shared / "connections"
    runtime = Path(tempfile.mkdtemp(prefix="gr-", dir="/tmp"))  # short: gpuops' own sockets fit there
    listener = other.start("python3", "-c", FAKE_MASTER, str(sock), str(mark))
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
        home = tmp_path / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(
            f"Host pve-alias\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
            f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {sshd.known_hosts}\n  ControlMaster auto\n"
            f"  ControlPath {sock}\n")
        inv = write_inventory(tmp_path / "inv.yaml", sshd)
        inv.write_text(inv.read_text().replace(f"address: {sshd.host}", "address: pve-alias"))
        result = gpuops("status", "-i", str(inv), env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
                                                       "SSH_AUTH_SOCK": ""})
        assert result.code == 0 and "ct200: reachable via pve1, container 200 running" in result.text, result
        assert not mark.exists(), result  # not even connected to
        assert [p for p in (runtime / "gpuops" / "cm").iterdir() if stat.S_ISSOCK(p.stat().st_mode)]
    finally:
        listener.kill()
        listener.wait(timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)


# -- the crash file (item 7) -----------------------------------------------------------------------


def _crash(monkeypatch: pytest.MonkeyPatch, tmpdir: Path) -> tuple[int, str]:
    """`gpuops status` with a bug injected into its core (as tests/cli/test_cli_basics.py does), under TMPDIR `tmpdir`."""
    import gpuops.client.status
    from gpuops.cli.main import main

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("injected bug in the core")

    monkeypatch.setattr(gpuops.client.status, "probe_target", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    result = CliRunner().invoke(main, ["status", "-i", str(LOCAL_INV)])
    return result.exit_code, result.stderr


def test_a_link_another_user_planted_for_the_crash_file_is_never_followed(tmp_path: Path, other: OtherUser,
                                                                         shared: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash folder was one shared /tmp/gpuops-crash with predictable names (time and pid): the other user
    made it first and planted links there to a file of root's, which the next crash overwrote."""
    precious = tmp_path / "precious"
    precious.write_text("root's own\n")
    planted = shared / "gpuops-crash"
    other.run("mkdir", "-m", "0777", str(planted))
    now = time.time()
    for second in range(-2, 30):  # the names of the next half minute's crashes of this process
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + second))
        other.run("ln", "-s", str(precious), str(planted / f"crash-{stamp}-{os.getpid()}.txt"))
    code, err = _crash(monkeypatch, shared)
    assert code == 1 and "internal error: ZeroDivisionError: injected bug in the core" in err, err
    assert precious.read_text() == "root's own\n"
    crash = Path(err.split("the traceback is in ", 1)[1].split(";", 1)[0])
    assert crash.parent == shared / f"gpuops-{os.getuid()}" / "crash" and "injected bug" in crash.read_text()
    assert stat.S_IMODE(crash.stat().st_mode) == 0o600 and stat.S_IMODE(crash.parent.stat().st_mode) == 0o700


def test_a_crash_whose_file_cannot_be_written_is_still_one_line(tmp_path: Path, other: OtherUser, shared: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every folder the crash file could go to is taken by the other user's files: the bug is still said in one
    line with exit 1, never as raw tracebacks (the crash of the crash report)."""
    for name in ("gpuops-crash", f"gpuops-{os.getuid()}"):
        other.run("touch", str(shared / name))
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("not a folder\n")
    monkeypatch.setenv("HOME", str(home))
    code, err = _crash(monkeypatch, shared)
    assert code == 1, err
    assert "Traceback" not in err and "internal error: ZeroDivisionError: injected bug in the core" in err, err
    assert "its traceback could not be written" in err and f"belongs to user {other.name}" in err, err


# -- reports written through a temporary (item 8) --------------------------------------------------


def _junit(path: str) -> None:
    from gpuops.cli.reports.junit import write

    write(path, "launch", [])


def _page(path: str) -> None:
    from gpuops.cli.reports.html.page import write

    write(path, "<!DOCTYPE html><html><body>report</body></html>\n")


@pytest.mark.parametrize("writer", [_page, _junit], ids=["report", "junit"])
def test_a_report_never_writes_through_a_link_planted_beside_it(tmp_path: Path, other: OtherUser, writer) -> None:
    """`--report FILE`, `report -o FILE` (the page) and `--junit FILE` wrote FILE.tmp-<pid>: in a folder the other
    user may write (theirs, or a 0777 drop folder), their link there made gpuops overwrite a file of root's."""
    drop = Path(tempfile.mkdtemp(prefix="gpuops-drop-", dir="/tmp"))
    try:
        drop.chmod(0o777)
        precious = tmp_path / "precious"
        precious.write_text("root's own\n")
        out = drop / "out.xml"
        other.run("ln", "-s", str(precious), f"{out}.tmp-{os.getpid()}")
        writer(str(out))
        assert precious.read_text() == "root's own\n"
        assert out.is_file() and not out.is_symlink() and out.read_text().strip()
        assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()  # as a new file: CI uploads read it
        assert sorted(p.name for p in drop.iterdir()) == sorted([out.name, f"{out.name}.tmp-{os.getpid()}"])
    finally:
        shutil.rmtree(drop, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_report_to_one_of_the_processes_own_streams_or_a_named_pipe_is_written_through(tmp_path: Path) -> None:
    """`--junit /dev/stdout` or `--report >(cat)`: the stream gets the bytes; nothing is renamed over it (as
    root, a rename over /dev/stdout replaced the link itself)."""
    from gpuops.localfiles import write_whole

    read_end, write_end = os.pipe()
    try:
        write_whole(f"/dev/fd/{write_end}", b"<testsuites/>\n")
        assert os.read(read_end, 100) == b"<testsuites/>\n"
    finally:
        os.close(read_end)
        os.close(write_end)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_whole(str(fifo), b"report\n")
        assert os.read(reader, 100) == b"report\n"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
