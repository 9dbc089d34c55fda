"""The GPUs' own health end to end: real sshd + pct into CT 200, real tmux, the watchdog with nobody attached, the
bench's nvidia-smi with per-GPU health state, and the Proxmox host's kernel log (journalctl and dmesg stand-ins over
a file a test appends the driver's real Xid lines to: bench/kmsg.py).

What an operator notices is asserted: preflight refuses a GPU that needs a reset or service (exit 4), naming it
(index, bus id, UUID), the counter and NVIDIA's action, while a playbook that does not use it starts; an Xid 79 on
a run GPU, in the host's kernel log of a detached run, stops the run within seconds with exit 10, and status, runs
and the notification name Xid 79 and the GPU, while an Xid on a GPU the run does not use changes nothing; a run
that would restart on a stall or a failure is not restarted onto a GPU that took an Xid that needs a reset;
`gpuops health --json` follows the schema; nothing of the host's follower is left once the run is over.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench import wait_until
from bench.cli import CtCli, gpuops

SESSION = "hw-train"


def playbook(ct: CtCli, gpus: list[int], command: str, **sections: Any) -> Path:
    data: dict[str, Any] = {"name": "hw", "preflight": {"gpus": gpus},
                            "launch": {"session": SESSION, "command": command}, **sections}
    return ct.write(data)


def steps(gpus: list[int], *extra: str) -> str:
    return " ".join(["fake-train", "--mode", "steps", "--gpus", ",".join(map(str, gpus)), "--interval", "0.2",
                     "--steps", "100000", *extra])


def status_run(ct: CtCli) -> dict[str, Any]:
    result = ct.gpuops("status", "--json")
    (obj,) = [o for o in result.events() if o["event"] == "status"]
    (session,) = [s for s in obj["sessions"] if s["session"] == SESSION]
    return session["run"]


def test_preflight_refuses_a_gpu_that_needs_a_reset_or_service_and_a_playbook_without_it_starts(ct: CtCli) -> None:
    gpus = ct.fake.gpus(200)
    gpus.set_health(6, ecc_uncorrected_volatile=2)
    gpus.set_health(7, remap_failure=True)
    playbook(ct, [5, 6, 7], steps([5, 6, 7]))
    refused = ct.gpuops("launch", "--json")
    assert refused.code == 4, refused
    (summary,) = [e for e in refused.events() if e["event"] == "summary"]
    message = summary["message"]
    for index in (6, 7):  # each named by index, bus id and UUID
        assert f"GPU {index} ({gpus.bus_id(index)}, {gpus.state()['gpus'][index]['uuid']})" in message
    assert "needs reset: ecc.errors.uncorrected.volatile.total = 2" in message and "nvidia-smi -r" in message
    assert "needs service: remapped_rows.failure = Yes" in message and "contact NVIDIA support" in message
    assert "GPU 5 " not in message
    findings = {f["index"]: f for f in summary["gpus"]}
    assert (findings[6]["verdict"], findings[7]["verdict"]) == ("needs reset", "needs service")
    assert not ct.run_dirs()  # nothing was started
    playbook(ct, [4, 5], steps([4, 5]))  # the healthy GPUs: the run starts, each GPU's verdict said
    started = ct.gpuops("launch", "--detach", "--json")
    assert started.code == 0, started
    (ok,) = [e for e in started.events() if e["event"] == "preflight_ok"]
    assert [(g["index"], g["bus_id"], g["verdict"]) for g in ok["gpus"]] == [(i, gpus.bus_id(i), "ok") for i in (4, 5)]
    assert ct.session_alive()
    assert ct.gpuops("stop").code == 0


def host_log(ct: CtCli) -> list[dict[str, Any]]:
    path = ct.run_dir() / "host-xids.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def follower_processes(ct: CtCli) -> list[int]:
    """The host's follower, its reader and the link into the container: every process of it, on either side."""
    from bench import procs

    root = str(ct.fake.root).encode()

    def ours(pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return any(word in cmdline for word in (b"host-watch", b"host-link", b"journalctl", b"dmesg"))

    return [pid for pid in procs.find(lambda env: root in env.get(b"GPUOPS_FAKE_GPUS", b"")) if ours(pid)]


def test_an_xid_79_on_a_run_gpu_stops_a_detached_run_with_exit_10_named_in_status_runs_and_the_notification(
        ct: CtCli) -> None:
    kernel = ct.fake.kernel_log.enable()
    gpus = ct.fake.gpus(200)
    notified = ct.fake.home(200) / "notified.jsonl"
    playbook(ct, [5], steps([5]), notify=[{"on": ["aborted", "warned", "ended"],
                                           "command": 'cat "$GPUOPS_NOTIFY_JSON" >> "$HOME/notified.jsonl"; '
                                                      'echo >> "$HOME/notified.jsonl"'}])
    launch = ct.gpuops("launch", "--detach", "--json")
    assert launch.code == 0, launch
    (follow,) = [e for e in launch.events() if e["event"] == "host_kernel_log"]
    assert (follow["state"], follow["reader"], follow["gpus"]) == ("following", "journalctl", [5])
    wait_until(lambda: any(r["kind"] == "following" for r in host_log(ct)), message="the host's follower's first record")
    # An Xid on a GPU the run does not use, then one of the application's on the run's GPU: the first changes
    # nothing, the second only warns; the run goes on.
    kernel.append_xid(gpus.bus_id(2), 79)
    kernel.append_xid(gpus.bus_id(5), 13)
    wait_until(lambda: any(r.get("code") == 13 for r in host_log(ct)), message="Xid 13 handed over")
    wait_until(lambda: (ct.run_dir() / "events.jsonl").exists() and '"rule": "gpu-xid"' in
               (ct.run_dir() / "events.jsonl").read_text().replace('"rule":"', '"rule": "'), message="the warning")
    assert ct.session_alive() and not (ct.run_dir() / "hardware.json").exists()
    assert [r["index"] for r in host_log(ct) if r["kind"] == "xid"] == [5]  # GPU 2's Xid never reached the run
    # GPU 5 falls off the bus: the run stops, exit 10, with nobody attached.
    appended = time.time()
    kernel.append_xid(gpus.bus_id(5), 79)
    wait_until(lambda: not ct.session_alive(), timeout=30, message="the run to be stopped by the Xid")
    if os.environ.get("GPUOPS_MEASURE_XID"):  # benchmarks: the Xid line appended to the run's session gone
        done = wait_until(lambda: (ct.run_dir() / "abort-done.json").exists() and
                          json.loads((ct.run_dir() / "abort-done.json").read_text()))
        match = next(json.loads(x)["ts"] for x in (ct.run_dir() / "events.jsonl").read_text().splitlines()
                     if '"xid": 79' in x.replace('"xid":', '"xid": ') or "Xid 79" in x)
        print("XID-LATENCY handed-over-and-matched", round(match - appended, 3), "session-gone",
              round(done["session_gone_at"] - appended, 3))
    run = status_run(ct)
    assert (run["state"], run["exit_code"], run["last_match"]) == ("hardware", 10, "gpu-xid"), run
    hw = run["hardware"]
    assert (hw["xid"]["code"], hw["gpu"]["index"], hw["gpu"]["bus_id"]) == (79, 5, gpus.bus_id(5)), hw
    assert "reboot the host" in hw["action"]
    text = ct.gpuops("status").err + ct.gpuops("status").text
    assert "Xid 79 (GPU has fallen off the bus) on GPU 5 (" + gpus.bus_id(5) in text, text
    runs = ct.gpuops("runs", "--json")
    (row,) = [e for e in runs.events() if e["event"] == "run"]
    assert (row["outcome"], row["exit_code"], row["rule"], row["hardware"]["xid"]["code"]) == ("hardware", 10, "gpu-xid", 79)
    assert f"gpu-xid (Xid 79 on GPU 5 {gpus.bus_id(5)})" in ct.gpuops("runs").text
    wait_until(lambda: notified.exists() and '"what": "ended"' in notified.read_text().replace('"what":"', '"what": "'),
               timeout=30, message="the ended notification")
    payloads = [json.loads(x) for x in notified.read_text().splitlines() if x.strip()]
    aborted = next(x for x in payloads if x["what"] == "aborted")
    ended = next(x for x in payloads if x["what"] == "ended")
    for said in (aborted, ended):
        assert (said["outcome"], said["exit_code"], said["rule"]) == ("hardware", 10, "gpu-xid"), said
        assert "Xid 79" in said["text"] and "GPU 5" in said["text"], said["text"]
        assert said["hardware"]["gpu"]["uuid"] == gpus.state()["gpus"][5]["uuid"]
    warned = [x for x in payloads if x["what"] == "warned"]
    assert warned and "Xid 13" in warned[0]["text"] and warned[0]["exit_code"] is None
    # The follower ends with the run: nothing of it is left on the host or in the container.
    wait_until(lambda: not follower_processes(ct), timeout=30, message="the host's follower to end with the run")
    assert host_log(ct)[-1]["kind"] == "ended"


def test_a_crash_after_an_xid_that_needs_a_reset_is_the_xid_and_no_restart_starts_on_the_gpu(ct: CtCli) -> None:
    """gpu_xid only warns here, so the Xid does not stop the run: the training's own crash does. The crash is
    reported as the Xid (exit 10), and restart.on's `failed` does not start attempt 2 on the GPU: it says why."""
    kernel = ct.fake.kernel_log.enable()
    gpus = ct.fake.gpus(200)
    go = ct.fake.home(200) / "go"
    playbook(ct, [5], f"fake-train --mode sample --sample clean_training.txt --gpus 5 --interval 0.2 --go {go}",
             watch={"gpu_xid": {"action": "warn"}}, restart={"max": 2, "on": ["stall", "failed"], "delay": 1})
    assert ct.gpuops("launch", "--detach").code == 0
    wait_until(lambda: any(r["kind"] == "following" for r in host_log(ct)), message="the host's follower")
    kernel.append_xid(gpus.bus_id(5), 48)  # a double-bit ECC error: reset the GPU
    wait_until(lambda: any(r.get("code") == 48 for r in host_log(ct)), message="Xid 48 handed over")
    go.touch()  # the training fails (exit 1), as it would on the GPU's error
    wait_until(lambda: status_run(ct)["state"] not in ("running", "aborting", "restarting"), timeout=60,
               message="the run to end")
    run = status_run(ct)
    assert (run["state"], run["exit_code"], run["command_exit_code"], run["attempts"]) == ("hardware", 10, 1, 1), run
    hw = run["hardware"]
    assert (hw["rule"], hw["xid"]["code"], hw["gpu"]["index"], hw["instead_of"]) == ("gpu-xid", 48, 5, "failed")
    assert "no restart: GPU 5" in hw["restart_blocked"] and "Xid 48" in hw["restart_blocked"]
    events = [json.loads(x) for x in (ct.run_dir() / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "restart_failed"]
    assert failed and failed[0]["attempt"] == 2 and "Xid 48" in failed[0]["message"], events
    assert not [e for e in events if e["event"] in ("restart", "attempt_started")]
    assert not (ct.run_dir() / "attempts").exists()


def test_gpuops_health_gives_each_gpu_its_counters_xids_and_verdict_in_the_schema(ct: CtCli) -> None:
    kernel = ct.fake.kernel_log.enable()
    gpus = ct.fake.gpus(200)
    gpus.set_health(3, slowdown=["hw_thermal_slowdown"], pcie={"width": 8})
    gpus.set_health(4, remap_pending=True)
    gpus.set_health(6, recovery_action="Reset")
    gpus.set_health(7, lost=True)
    kernel.append_xid(gpus.bus_id(5), 119)  # a GSP timeout: reset the GPU
    kernel.append_xid(gpus.bus_id(1), 43, t=time.time() - 7200)  # older than the window: not read
    result = gpuops("health", "-i", str(ct.inventory), "-t", "ct200", "--json")  # checked against `gpuops schema`
    assert result.code == 10, result
    (obj,) = result.events()
    assert (obj["event"], obj["reachable"], obj["verdict"], obj["kernel_log"]["reader"]) == (
        "health", True, "needs reset", "journalctl")
    by = {g["index"]: g for g in obj["gpus"]}
    assert {i: by[i]["verdict"] for i in range(8)} == {0: "ok", 1: "ok", 2: "ok", 3: "warn", 4: "needs reset",
                                                       5: "needs reset", 6: "needs reset", 7: "needs reset"}
    assert by[3]["clocks_event_reasons"] == ["gpu_idle", "hw_thermal_slowdown"] and by[3]["link"]["width"] == 8
    assert by[0]["ecc"] == {"uncorrected_volatile": 0, "corrected_volatile": 0, "uncorrected_aggregate": 0}
    assert [x["code"] for x in by[5]["xids"]] == [119] and by[5]["xids"][0]["resolution"] == "reset_gpu"
    assert by[1]["xids"] == []
    assert by[7]["lost"].startswith("Unable to determine the device handle for GPU")
    assert by[7]["bus_id"] == gpus.bus_id(7)[4:]
    text = gpuops("health", "-i", str(ct.inventory), "-t", "ct200")
    assert "GPU 6 (" in text.text and "NEEDS RESET" in text.text and "gpu_recovery_action" in text.text, text
    playbook(ct, [0, 3], steps([0, 3]))  # -p: the playbook's GPUs only, none of which needs a reset
    mine = ct.gpuops("health", "--json", "-p", str(ct.playbook))
    assert mine.code == 0, mine
    assert [g["index"] for g in mine.events()[0]["gpus"]] == [0, 3]


def test_a_following_client_reads_the_hosts_kernel_log_for_a_crash_its_follower_did_not_see(ct: CtCli) -> None:
    """The host's follower dies mid-run (its link says so): the crash that comes later is read against the host's
    kernel log by the client that follows the run, and reported as the Xid (exit 10), in the summary and in runs."""
    import os
    import signal

    kernel = ct.fake.kernel_log.enable()
    gpus = ct.fake.gpus(200)
    go = ct.fake.home(200) / "go"
    playbook(ct, [5], f"fake-train --mode sample --sample clean_training.txt --gpus 5 --interval 0.2 --go {go}")
    launch = ct.start("launch", "--json")
    launch.wait_for(lambda: any(r["kind"] == "following" for r in host_log(ct)) if ct.run_dirs() else False,
                    "the host's follower")
    (host_pid,) = [r["host_pid"] for r in host_log(ct) if r["kind"] == "following"]
    os.kill(host_pid, signal.SIGKILL)
    wait_until(lambda: host_log(ct)[-1]["kind"] == "ended", message="the link to see its follower gone")
    assert host_log(ct)[-1]["why"] == "the host's follower ended"
    kernel.append_xid(gpus.bus_id(5), 95)  # an uncontained ECC error: reset the GPU; nobody hands it over
    go.touch()
    done = launch.finish()
    assert done.code == 10, done
    summary = done.events()[-1]
    assert (summary["outcome"], summary["rule"], summary["hardware"]["xid"]["code"]) == ("hardware", "gpu-xid", 95)
    assert "the crash is reported as the Xid (read by the following client)" in summary["hardware"]["message"]
    (row,) = [e for e in ct.gpuops("runs", "--json").events() if e["event"] == "run"]
    assert (row["outcome"], row["exit_code"]) == ("hardware", 10)


def test_new_uncorrected_ecc_errors_during_a_run_stop_it_with_exit_10_and_the_counter_named(ct: CtCli) -> None:
    """The watchdog's own nvidia-smi loop carries the health fields: a GPU that takes uncorrected ECC errors mid-run
    ends the run (gpu-ecc, exit 10), with no host kernel log at all (the bench host's is not readable here)."""
    gpus = ct.fake.gpus(200)
    playbook(ct, [5, 6], steps([5, 6]), watch={"sample_interval": 0.5})
    assert ct.gpuops("launch", "--detach").code == 0
    wait_until(lambda: '"health"' in (ct.run_dir() / "watchdog.json").read_text(), message="health samples")
    gpus.set_health(6, ecc_uncorrected_volatile=3)
    wait_until(lambda: not ct.session_alive(), timeout=30, message="the run to be stopped by gpu-ecc")
    run = status_run(ct)
    hw = run["hardware"]
    assert (run["state"], run["exit_code"], hw["rule"], hw["gpu"]["index"], hw["counter"], hw["value"]) == (
        "hardware", 10, "gpu-ecc", 6, "ecc.errors.uncorrected.volatile.total", 3), run
    assert "3 new uncorrected ECC error(s) during the run (0 at its start, 3 now)" in hw["message"]
    assert "nvidia-smi -r -i " + gpus.bus_id(6) in hw["action"]
