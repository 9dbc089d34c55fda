"""The bench's stand-ins answer the health queries as the real tools did (tests/data/real_h200/health/: nvidia-smi of
driver 580.159.04 and util-linux's dmesg on the lent GPU machine, an H100 80GB HBM3 the lender gave when an H200 was
asked for). Each record's own command is run against the stand-in: the same header, the same shape of each value
(digits may differ: it is another GPU, idle at another temperature), the same refusals and exit codes."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from bench import BIN_DIR, FakeGpus
from bench.kmsg import KernelLog

REAL = Path(__file__).parent / "data" / "real_h200" / "health"
#: Who the GPU is: its own on every machine.
IDENTITY = {"pci.bus_id", "uuid", "name"}


def record(name: str) -> tuple[list[str], list[str], str]:
    """A record's argv, its output lines, its `## exit` line."""
    lines = (REAL / name).read_text().splitlines()
    return shlex.split(lines[0][2:]), [x for x in lines[1:] if not x.startswith("## ")], lines[-1]


def run(argv: list[str], gpus: Path, **env: str) -> tuple[int, list[str]]:
    done = subprocess.run([str(BIN_DIR / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{BIN_DIR}:/usr/bin:/bin", "GPUOPS_FAKE_GPUS": str(gpus), **env})
    return done.returncode, (done.stdout + done.stderr).splitlines()


def shape(value: str) -> str:
    return re.sub(r"\d", "9", value)


@pytest.fixture
def one_gpu(tmp_path: Path) -> Path:
    FakeGpus(tmp_path / "gpus").create(1)  # the lent machine had one GPU, index 0
    return tmp_path / "gpus"


@pytest.mark.parametrize("name", ["health-csv.txt", "health-csv-noheader.txt", "health-csv-noheader-nounits.txt",
                                  "index-one-missing.txt", "old-throttle-names.txt", "by-bus-id.txt"])
def test_the_stand_in_answers_each_recorded_health_query_in_the_real_drivers_form(name: str, one_gpu: Path) -> None:
    argv, real, code = record(name)
    argv = [a.replace("00000000:00:06.0", FakeGpus(one_gpu).bus_id(0)) for a in argv]
    got_code, got = run(argv, one_gpu)
    assert f"## exit {got_code}" == code and len(got) == len(real)
    fields = re.search(r"--query-gpu=(\S+)", " ".join(argv)).group(1).split(",")
    if "noheader" not in " ".join(argv):
        assert got[0] == real[0]  # the header, names the query spells otherwise included (retired_pages.sbe)
        real, got = real[1:], got[1:]
    for real_row, row in zip(real, got, strict=True):
        pairs = list(zip(fields, real_row.split(", "), row.split(", "), strict=True))
        assert [(f, shape(r)) for f, r, _ in pairs if f not in IDENTITY] == [
            (f, shape(g)) for f, _, g in pairs if f not in IDENTITY]


def test_the_stand_in_refuses_what_the_real_driver_refuses_with_its_words_and_codes(one_gpu: Path) -> None:
    for line in (REAL / "health-each-field.txt").read_text().splitlines():
        field, code, said = line.split("\t")
        got_code, got = run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], one_gpu)
        assert str(got_code) == code and (got[0] == said or (code == "0" and shape(got[0]) == shape(said))
                                          or field in IDENTITY), (field, got)
    argv, real, code = record("unknown-field.txt")
    assert run(argv, one_gpu) == (2, real) and code == "## exit 2"
    argv, real, code = record("index-out-of-range.txt")
    assert run(argv, one_gpu) == (6, real)


def test_the_loop_form_with_the_health_fields_repeats_rows_of_the_real_shape(one_gpu: Path) -> None:
    argv, real, _ = record("loop-health.txt")  # `-lms 500 -i 0`, ended by a timeout
    proc = subprocess.Popen([str(BIN_DIR / "nvidia-smi"), *argv[1:]], stdout=subprocess.PIPE, text=True,
                            env={"PATH": f"{BIN_DIR}:/usr/bin:/bin", "GPUOPS_FAKE_GPUS": str(one_gpu)})
    try:
        rows = [proc.stdout.readline().strip() for _ in range(2)]
    finally:
        proc.kill()
        proc.wait()
    assert [shape(r.replace(FakeGpus(one_gpu).bus_id(0), "00000000:00:06.0")) for r in rows] == [shape(real[0])] * 2


def test_dmesg_reads_the_kernel_log_in_the_real_forms_and_refuses_as_the_real_one(tmp_path: Path) -> None:
    log = KernelLog(tmp_path / "kmsg")
    assert run(["dmesg"], tmp_path, GPUOPS_FAKE_KMSG=str(log.path)) == (
        1, [record("dmesg-as-nobody.txt")[1][-1]])  # not readable (dmesg_restrict, a user who is not root)
    log.enable()
    real_iso, real_raw = record("dmesg-time-format.txt")[1][0], record("dmesg.txt")[1][0]
    stamp_iso, stamp_raw = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}\+00:00 ", r"\[ *\d+\.\d{6}\] "
    assert re.match(stamp_iso, real_iso) and re.match(stamp_raw, real_raw)
    code, iso = run(["dmesg", "--time-format", "iso"], tmp_path, GPUOPS_FAKE_KMSG=str(log.path))
    assert code == 0 and all(re.match(stamp_iso, x) for x in iso) and "NVRM: loading NVIDIA UNIX" in iso[1]
    code, raw = run(["dmesg"], tmp_path, GPUOPS_FAKE_KMSG=str(log.path))
    assert code == 0 and raw[1] == record("dmesg-nvrm.txt")[1][2]  # `[    0.544791] NVRM: loading ...`, as recorded
    assert run(["dmesg", "--time-format", "iso"], tmp_path, GPUOPS_FAKE_KMSG=str(log.path), GPUOPS_FAKE_CT="200")[0] == 1
    assert run(["dmesg", "--bogus"], tmp_path, GPUOPS_FAKE_KMSG=str(log.path)) == (
        1, ["dmesg: unrecognized option '--bogus'", "Try 'dmesg --help' for more information."])
    follow = subprocess.run(["timeout", "2", str(BIN_DIR / "dmesg"), "--follow"], capture_output=True,
                            env={"GPUOPS_FAKE_KMSG": str(log.path)}, timeout=30)
    assert follow.returncode == 124  # it waits for new records until it is killed, as dmesg-follow.txt shows


def test_journalctl_shows_the_kernels_lines_on_the_host_and_none_in_a_container(tmp_path: Path) -> None:
    log = KernelLog(tmp_path / "kmsg").enable()
    log.append_xid("00000000:9A:00.0", 79)
    env = {"GPUOPS_FAKE_KMSG": str(log.path)}
    code, out = run(["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso-precise", "--since", "@0"], tmp_path, **env)
    assert code == 0 and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00 pve1 kernel: NVRM: Xid \(PCI:0000:9a:00\)"
                                  r": 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus\.$", out[-2])
    assert run(["journalctl", "-k", "--no-pager"], tmp_path, GPUOPS_FAKE_CT="200", **env) == (0, ["-- No entries --"])
    assert run(["journalctl", "--bogus"], tmp_path, **env) == (1, ["journalctl: unrecognized option '--bogus'"])


def test_the_watchdogs_loop_drops_a_field_the_driver_refuses_and_samples_on(one_gpu: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that does not know a health field fails the whole query (exit 2, as the 580 driver refuses
    reset_status.*): the sampler asks again at once without it, so memory and health are sampled all the same."""
    import time

    from gpuops.agent.detect import sampler as s

    monkeypatch.setenv("PATH", f"{BIN_DIR}:/usr/bin:/bin")
    monkeypatch.setenv("GPUOPS_FAKE_GPUS", str(one_gpu))
    monkeypatch.setattr(s, "LOOP_HEALTH", s.LOOP_HEALTH + ("reset_status.reset_required",))
    loop = s.Sampler([0], 0.2)
    got: list = []
    deadline = time.monotonic() + 30
    try:
        while not got and time.monotonic() < deadline:
            got = loop.poll(time.time())
            time.sleep(0.05)
    finally:
        loop.stop()
    assert got, loop.problem
    sample, health = got[0]
    assert sample == {0: (0, 0)} and health.rows[0].mask == 1 and health.rows[0].bus_id == FakeGpus(one_gpu).bus_id(0)
    assert "reset_status.reset_required" not in loop.fields and loop.problem.startswith(s.REFUSED)
