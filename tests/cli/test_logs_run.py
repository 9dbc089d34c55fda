"""`gpuops logs --run ID`: an earlier run of the playbook's session, printed or followed to the code it
ended with; an unknown id names the runs the session has; and `--run` completes the target's run ids
(connecting, within its time budget, silent when the target does not answer). CT 200 behind the real
sshd, CT 300 on a host that is down.
"""

from __future__ import annotations

import time

from bench import SshServer
from test_completion import complete, values
from test_multi_target import Fleet, fleet  # noqa: F401 - the fixture


def two_runs(fleet: Fleet) -> tuple[str, str]:
    """On CT 200: a run the FX race aborted (exit 7), then one that printed a line and exited 3 (exit 6)."""
    assert fleet.run("launch", "ct200").code == 7
    first = fleet.run_id(200)
    fleet.write("printf 'second run\\n'; exit 3")
    assert fleet.run("launch", "ct200").code == 6
    second = fleet.run_id(200)
    assert first != second
    return first, second


def test_logs_run_prints_or_follows_an_earlier_run_and_ends_with_its_code(fleet: Fleet) -> None:
    first, second = two_runs(fleet)
    printed = fleet.run("logs", "ct200", extra=("--run", first))
    assert printed.code == 0, printed
    assert printed.out == (fleet.fake.home(200) / ".gpuops" / "runs" / first / "log").read_bytes()
    assert b"Detected that you are using FX" in printed.out and b"second run" not in printed.out
    followed = fleet.run("logs", "ct200", extra=("--run", first, "-f", "--json"))
    assert followed.code == 7, followed
    summary = followed.events()[-1]
    assert (summary["run"], summary["outcome"], summary["exit_code"], summary["rule"]) == (first, "aborted", 7, "fx-tracing-race")
    assert {e["run"] for e in followed.events()} == {first}
    current = fleet.run("logs", "ct200", extra=("--run", second, "-f"))
    assert (current.code, current.out) == (6, b"second run\n"), current
    assert fleet.run("logs", "ct200", extra=("--tail", "1")).out == b"second run\n"  # without --run: the current run


def test_an_unknown_run_id_is_exit_2_naming_the_sessions_runs(fleet: Fleet, sshd: SshServer) -> None:
    first, second = two_runs(fleet)
    result = fleet.run("logs", "ct200", extra=("--run", "20200101-000000-abcdef"))
    assert result.code == 2, result
    assert result.err.splitlines()[0] == (
        f"gpuops: error: ct200: session 'multi' has no run 20200101-000000-abcdef; its runs, newest first: {second}, {first}")
    assert result.out == b""
    before = sshd.connection_count()
    bad = fleet.run("logs", "ct200", extra=("--run", "../../etc"))
    assert bad.code == 2 and "--run '../../etc': not a run id" in bad.err, bad
    several = fleet.run("logs", "ct200", "ct201", extra=("--run", first))
    assert several.code == 2 and "is a run of one target: pass one -t" in several.err, several
    assert sshd.connection_count() == before  # both refused before connecting


def test_run_ids_complete_from_the_target_and_a_dead_host_completes_nothing_quietly(fleet: Fleet, sshd: SshServer) -> None:
    first, second = two_runs(fleet)
    words = f"gpuops logs -i {fleet.inventory} -p {fleet.playbook} -t ct200 --run "
    assert values("bash", complete("bash", words)) == [("plain", second), ("plain", first)]
    assert values("bash", complete("bash", words + first[:-1])) == [("plain", first)]
    down = complete("bash", words.replace("ct200", "ct300"))
    assert (down.returncode, down.stdout.strip(), down.stderr) == (0, "", ""), down
    sshd.freeze()  # TCP is up, SSH never answers: the completion gives up within its budget
    try:
        began = time.monotonic()
        frozen = complete("bash", words)
        took = time.monotonic() - began
    finally:
        sshd.thaw()
    assert (frozen.returncode, frozen.stdout.strip(), frozen.stderr) == (0, "", ""), frozen
    assert took < 10, took  # 3 s budget, plus starting Python on a loaded machine
