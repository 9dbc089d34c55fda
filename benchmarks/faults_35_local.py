"""The fault matrix's rows for issue 35 items 2, 7, 8 and 11 (another local user of the machine gpuops runs
on, the user's ControlMaster, what validate lets through): each reuses its test (tests/test_localfiles.py,
test_openssh.py, test_nodes.py, test_restart_config.py), the SSH ones on a fresh real-sshd bench through
faults_agent.on_bench, so the matrix and the suite cannot drift apart. The other user is a real one, added
for the row and removed after; where users cannot be added here, those rows say so and are skipped."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest
import test_localfiles as lf  # tests/ and its areas are on sys.path through benchkit
import test_nodes as tn
import test_openssh as to
import test_restart_config as tr
from bench.users import OtherUser, UsersUnavailable, shared_folder
from faults_agent import on_bench
from test_watch import Ct

Result = Tuple[str, bool]


def _case(ct_or_none: Ct | None = None) -> Path:
    """A fresh folder for one test's tmp_path (inside the row's bench where there is one)."""
    if ct_or_none is not None:
        folder = ct_or_none.tmp / "case"
        folder.mkdir()
        return folder
    return Path(tempfile.mkdtemp(prefix="gpuops-fault-"))


def as_other(test: Callable[..., None], said: str, *, bench: bool = False, shared: bool = True,
             patch: bool = False) -> Callable[[], Result]:
    """A row whose test needs the other user (and a shared 1777 folder, a MonkeyPatch, or the bench's sshd)."""

    def body(ct: Ct | None) -> str:
        user = OtherUser.create()
        folder = shared_folder()
        try:
            args: List[Any] = [_case(ct)]
            if ct is not None:
                args += [ct.sshd, ct.fake]
            args.append(user)
            if shared:
                args.append(folder)
            with pytest.MonkeyPatch.context() as mp:
                test(*args, *([mp] if patch else []))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            user.remove()
        return said

    if bench:
        row = on_bench(body)
    else:
        def row() -> Result:
            try:
                return body(None), True
            except AssertionError as exc:
                return "NOT SURVIVED: " + (str(exc).splitlines() or ["assertion"])[0][:160], False

    def guarded() -> Result:
        try:
            return row()
        except UsersUnavailable as exc:
            return f"skipped: needs a second local user ({exc})", True

    return guarded


def with_runtime(test: Callable[[Path, Any, Any, Path], None], said: str) -> Callable[[], Result]:
    """A test_openssh row: its test on the bench with a short private XDG_RUNTIME_DIR of its own."""

    def body(ct: Ct) -> str:
        runtime = Path(tempfile.mkdtemp(prefix="gr-", dir="/tmp"))
        try:
            test(_case(ct), ct.sshd, ct.fake, runtime)
        finally:
            shutil.rmtree(runtime, ignore_errors=True)
        return said

    return on_bench(body)


def pure(tests: List[Callable[[Path], None]], said: str) -> Callable[[], Result]:
    """A row of tests that need only a folder (validate through the CLI, no bench)."""

    def row() -> Result:
        try:
            for test in tests:
                folder = _case()
                try:
                    test(folder)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
        except AssertionError as exc:
            return "NOT SURVIVED: " + (str(exc).splitlines() or ["assertion"])[0][:160], False
        return said, True

    return row


def _restart_warnings(tmp: Path) -> None:
    for section, said in (("restart: {max: 2}\n", "3:10: restart has no `on` (the rules whose end restarts an attempt"),
                          ("restart: {on: [stall]}\n", "3:10: restart has no `max` (0 by default)")):
        case = tmp / str(len(said))
        case.mkdir()
        tr.test_a_restart_section_that_can_restart_nothing_is_a_validate_warning(case, section, said)


def _delay_bound(tmp: Path) -> None:
    tr.test_bad_values(tmp, "restart: {max: 1, on: [stall], delay: 1e300}\n",
                       "3:39: expected a number of seconds 0..3600 (the run keeps its GPUs while it waits to restart)")


LOCAL_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("35.2 another user made $TMPDIR/gpuops-<uid> (0777) before the ssh master's folder", as_other(
        lf.test_ssh_files_never_go_under_a_temp_folder_another_user_made,
        "nothing put in their folder; 'not .../gpuops-0/cm: ... belongs to user ...'; status exit 0 without a master",
        bench=True)),
    ("35.2 another user listens at the user's ControlPath in a shared folder", as_other(
        lf.test_a_socket_another_user_serves_at_the_users_controlpath_is_never_used,
        "their socket never connected to; gpuops' own master in its private folder; status exit 0", bench=True)),
    ("35.7 a link another user planted for the next crash file", as_other(
        lf.test_a_link_another_user_planted_for_the_crash_file_is_never_followed,
        "root's file untouched; the crash file 0600 in $TMPDIR/gpuops-0/crash (0700); one line, exit 1", patch=True)),
    ("35.7 every crash folder taken by another user's files", as_other(
        lf.test_a_crash_whose_file_cannot_be_written_is_still_one_line,
        "exit 1, one line: 'its traceback could not be written (... belongs to user ...)', no traceback", patch=True)),
    ("35.8 a link planted at FILE.tmp-<pid> beside --report / report -o", as_other(
        lambda tmp, user: lf.test_a_report_never_writes_through_a_link_planted_beside_it(tmp, user, lf._page),
        "root's file untouched; the page written whole at FILE (0644), the link left alone", shared=False)),
    ("35.8 a link planted at FILE.tmp-<pid> beside --junit", as_other(
        lambda tmp, user: lf.test_a_report_never_writes_through_a_link_planted_beside_it(tmp, user, lf._junit),
        "root's file untouched; the JUnit XML written whole at FILE (0644), the link left alone", shared=False)),
    ("35.11 the user's lax master open, the inventory's pinned key changed", with_runtime(
        to.test_a_lax_master_of_the_users_is_no_way_around_the_known_hosts_the_inventory_pins,
        "their master (StrictHostKeyChecking no) not used: 'HOST KEY CHANGED', exit 3")),
    ("35.11 the user's ControlPath too long for a socket", with_runtime(
        to.test_a_controlpath_of_the_users_too_long_for_a_socket_leaves_gpuops_its_own_master,
        "gpuops' own master in its short folder: status exit 0, 1 SSH connection")),
    ("35.11 no folder short enough for gpuops' master", pure(
        [lambda tmp: _no_master(tmp)], "a private folder for ssh's logs, no master: no exit 2")),
    ("35.11 validate: a node the inventory lacks, target beside launch.nodes", pure(
        [tn.test_validate_refuses_a_node_the_inventory_lacks_as_launch_does,
         tn.test_target_beside_launch_nodes_is_an_error_at_its_line],
        "exit 2 at 'ct299''s line, as launch; target beside nodes exit 2 at 'target''s line")),
    ("35.11 validate: restart delay 1e300, restart without on or max", pure(
        [_delay_bound, _restart_warnings],
        "delay past 3600 s: exit 2 at its line; no on / no max: a warning at the section's line, exit 0")),
]


def _no_master(tmp: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        lf.test_no_folder_short_enough_for_a_socket_means_no_master_not_an_error(tmp, mp)
