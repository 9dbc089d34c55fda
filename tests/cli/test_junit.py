"""`--junit PATH` on `launch` and `logs -f`, run as CI runs it on the real-sshd bench; the XML is parsed back.

Every report is checked against the shape CI servers read (Jenkins/Ant JUnit schema: testsuites >
testsuite > testcase > failure|error|skipped, with their attributes), and its verdicts against what
the command said (exit code, the JSON summary's outcome and message).
"""

from __future__ import annotations

import functools
import re
import signal
import socket
import xml.dom.minidom
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from bench import SshServer
from bench.cli import Cli, CtCli, gpuops

SESSION = "junit-train"
WARMUP = "fake-warmup --gpu {gpu} --duration 0.3 --steps 2"
FX_LINE = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function"
SECRET = "hf_s3cr3t-value-0042"
VERDICTS = ("failure", "error", "skipped")


def train(mode: str, *extra: str) -> str:
    return " ".join(["fake-train", "--mode", mode, "--gpus", "5,6", "--interval", "0.05", *extra])


def playbook(ct: CtCli, command: str, *, warmup: str | None = WARMUP, stall: float = 0, **extra: Any) -> None:
    data: dict[str, Any] = {"name": "junit-test", "preflight": {"gpus": [5, 6]},
                            "launch": {"session": SESSION, "command": command},
                            "watch": {"stall_timeout": stall}, "abort": {"grace": 3}, **extra}  # fmt: skip
    if warmup:
        data["warmup"] = {"gpus": [5, 6], "command": warmup, "timeout": 60}
    ct.write(data)


def check_shape(root: ET.Element) -> None:
    """What CI servers read (Jenkins' and Ant's JUnit schema): structure, required attributes, consistent counts."""
    assert root.tag == "testsuites"
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in root:
        assert suite.tag == "testsuite"
        assert {"name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname"} <= set(suite.attrib)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", suite.get("timestamp", "")), suite.attrib
        assert float(suite.get("time", "")) >= 0
        tags = [child.tag for child in suite]
        assert tags == sorted(tags, key=["properties", "testcase", "system-out", "system-err"].index), tags
        for prop in suite.iter("property"):
            assert set(prop.attrib) == {"name", "value"}
        cases = suite.findall("testcase")
        counts = {"tests": len(cases), "failures": 0, "errors": 0, "skipped": 0}
        for case in cases:
            assert {"name", "classname", "time"} <= set(case.attrib) and float(case.get("time", "")) >= 0
            kinds = [child.tag for child in case]
            verdicts = [k for k in kinds if k in VERDICTS]
            assert len(verdicts) <= 1 and kinds[: len(verdicts)] == verdicts, kinds  # the verdict first, then output
            assert set(kinds) <= {*VERDICTS, "system-out", "system-err"}, kinds
            for verdict in verdicts:
                counts["failures" if verdict == "failure" else "errors" if verdict == "error" else "skipped"] += 1
                node = case.find(verdict)
                assert node is not None and "message" in node.attrib
                if verdict != "skipped":
                    assert node.get("type"), node.attrib
        assert {k: int(suite.get(k, "-1")) for k in counts} == counts
        for key in totals:
            totals[key] += counts[key]
    assert "skipped" not in root.attrib  # junit-10.xsd refuses it on <testsuites>; the suites carry it
    assert {k: int(root.get(k, "-1")) for k in totals if k != "skipped"} == {k: v for k, v in totals.items() if k != "skipped"}


@functools.lru_cache(maxsize=1)
def junit_xsd() -> Any:
    import xmlschema

    return xmlschema.XMLSchema(str(Path(__file__).parent.parent / "data" / "junit.xsd"))


def report(path: Path) -> ET.Element:
    junit_xsd().validate(str(path))  # the XSD's rules: elements, their attributes, required ones, time format
    root = ET.parse(path).getroot()
    check_shape(root)
    return root


def cases(root: ET.Element, suite: str = "ct200") -> dict[str, tuple[str, ET.Element]]:
    """testcase name -> (passed | failure | error | skipped, the element)."""
    node = root.find(f"testsuite[@name='{suite}']")
    assert node is not None, ET.tostring(root).decode()
    out = {}
    for case in node.findall("testcase"):
        verdict = next((child.tag for child in case if child.tag in VERDICTS), "passed")
        out[case.get("name", "")] = (verdict, case)
    return out


def properties(root: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in root.iter("property")}


def summary(result: Cli) -> dict[str, Any]:
    events = result.events()
    assert events[-1]["event"] == "summary", events[-3:]
    return events[-1]


def verdict(case: tuple[str, ET.Element], kind: str) -> ET.Element:
    assert case[0] == kind, ET.tostring(case[1]).decode()
    node = case[1].find(kind)
    assert node is not None
    return node


# -- the FX race, and the schema shape ------------------------------------------------------------


def test_an_fx_race_fails_training_with_the_rule_and_the_excerpt(ct: CtCli, tmp_path: Path) -> None:
    playbook(ct, train("fx-thread"))
    path = tmp_path / "report.xml"
    result = ct.gpuops("launch", "--json", "--junit", str(path))
    assert result.code == 7, result
    said = summary(result)
    root = report(path)
    got = cases(root)
    assert list(got) == ["preflight", "warmup GPU 5", "warmup GPU 6", "training"]
    assert [v for v, _ in got.values()] == ["passed", "passed", "passed", "failure"]
    assert all(float(got[f"warmup GPU {g}"][1].get("time", "")) >= 0.3 for g in (5, 6))
    failure = verdict(got["training"], "failure")
    assert failure.get("type") == said["outcome"] == "aborted"
    assert failure.get("message") == said["message"]
    text = failure.text or ""
    assert text.startswith("rule: fx-tracing-race\n")
    assert FX_LINE in text and "Traceback (most recent call last):" in text and "Exception in thread drafter-1:" in text
    props = properties(root)
    assert (props["run"], props["rule"], props["exit_code"], props["outcome"]) == (said["run"], "fx-tracing-race", "7",
                                                                                  "aborted")
    log_tail = got["training"][1].findtext("system-out") or ""
    assert "--- the end of the training log ---" in log_tail and FX_LINE in log_tail


def test_the_report_is_xml_that_ci_servers_parse(ct: CtCli, tmp_path: Path) -> None:
    # A log full of what XML cannot hold: ANSI colours, a bell, a NUL, a stray byte, markup characters.
    playbook(ct, "printf '\\033[31mred\\033[0m <b>&amp;</b> bell\\a nul\\000 byte\\377 done\\n'; " + train("steps", "--steps", "2"),
             warmup=None)
    path = tmp_path / "ci" / "junit.xml"
    path.parent.mkdir()
    result = ct.gpuops("launch", "--junit", str(path))
    assert result.code == 0, result
    raw = path.read_bytes()
    assert raw.startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    xml.dom.minidom.parseString(raw)  # a second, stricter parser agrees
    root = report(path)
    assert root.get("name") == "gpuops launch" and (root.get("failures"), root.get("errors")) == ("0", "0")
    got = cases(root)
    assert [v for v, _ in got.values()] == ["passed", "passed"]
    out = got["training"][1].findtext("system-out") or ""
    assert "red <b>&amp;</b> bell\\x07 nul\\x00 byte\ufffd done" in out and "step 2/2" in out
    assert got["training"][1].get("classname") == "junit-test.ct200"
    assert list(tmp_path.joinpath("ci").iterdir()) == [path]  # written whole: no temporary file left beside it


def test_secrets_are_masked_in_the_report(ct: CtCli, tmp_path: Path) -> None:
    playbook(ct, f"echo \"token is $HF_TOKEN\"; echo '{FX_LINE[:20]}'; " + train("fx-thread"),
             env={"HF_TOKEN": {"value": SECRET, "secret": True}})
    path = tmp_path / "report.xml"
    result = ct.gpuops("launch", "--junit", str(path))
    assert result.code == 7, result
    assert SECRET.encode() in result.out  # the job's own output is shown as it is ...
    text = path.read_text()
    assert SECRET not in text and "token is ***" in text  # ... the report, a CI artifact, masks it


# -- early ends: preflight, warmup, connection, configuration -------------------------------------


def test_busy_gpus_fail_preflight_and_skip_the_rest(ct: CtCli, tmp_path: Path) -> None:
    ct.fake.occupy_gpu(200, 6, mib=30000)
    playbook(ct, train("steps"))
    path = tmp_path / "report.xml"
    result = ct.gpuops("launch", "--junit", str(path))
    assert result.code == 4, result
    got = cases(report(path))
    failure = verdict(got["preflight"], "failure")
    assert failure.get("type") == "preflight-failed" and "GPU(s) 6 not idle" in (failure.get("message") or "")
    assert "GPU 5: ok" in (failure.text or "") and "GPU 6: BUSY" in (failure.text or "")
    for name in ("warmup GPU 5", "warmup GPU 6", "training"):
        assert verdict(got[name], "skipped").get("message") == "not run: preflight ended with preflight-failed"


def test_a_failing_warmup_fails_its_gpu_with_the_output_tail(ct: CtCli, tmp_path: Path) -> None:
    command = 'if [ "$GPUOPS_GPU" = 6 ]; then fake-warmup --gpu {gpu} --mode fail --steps 2 --duration 0.2; else ' + WARMUP + "; fi"
    playbook(ct, train("steps"), warmup=command)
    path = tmp_path / "report.xml"
    result = ct.gpuops("launch", "--json", "--junit", str(path))
    assert result.code == 5, result
    got = cases(report(path))
    assert got["preflight"][0] == "passed" and got["warmup GPU 5"][0] == "passed"
    failure = verdict(got["warmup GPU 6"], "failure")
    assert failure.get("type") == "warmup-failed" and failure.get("message") == summary(result)["message"]
    assert "InductorError" in (failure.text or "")
    assert verdict(got["training"], "skipped").get("message") == "not run: warmup GPU 6 ended with warmup-failed"


def test_an_unreachable_host_is_an_error_on_preflight(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts: {{pve1: {{address: 127.0.0.1, port: {dead}}}}}\ntargets: {{ct200: {{host: pve1, ctid: 200}}}}\n")
    pb = tmp_path / "pb.yaml"
    pb.write_text("launch: {session: s, command: train}\n")
    path = tmp_path / "report.xml"
    result = gpuops("launch", "-i", str(inv), "-p", str(pb), "-t", "ct200", "--yes", "--junit", str(path),
                    env={"GPUOPS_CONNECT_RETRY_TIME": "0"})
    assert result.code == 3, result
    got = cases(report(path))
    error = verdict(got["preflight"], "error")
    assert error.get("type") == "connect-error" and "connection refused" in (error.get("message") or "")
    assert got["training"][0] == "skipped"


def test_an_unknown_target_still_writes_a_report(ct: CtCli, tmp_path: Path) -> None:
    playbook(ct, train("steps"))
    path = tmp_path / "report.xml"
    result = gpuops("launch", "-i", str(ct.inventory), "-p", str(ct.playbook), "-t", "ct999", "--yes", "--junit", str(path))
    assert result.code == 2, result
    error = verdict(cases(report(path), "ct999")["preflight"], "error")
    assert error.get("type") == "usage-error" and "unknown target 'ct999'" in (error.get("message") or "")


def test_a_report_path_that_cannot_be_written_is_refused_before_anything_runs(ct: CtCli, tmp_path: Path,
                                                                            sshd: SshServer) -> None:
    playbook(ct, train("steps"))
    missing = tmp_path / "no-such-folder" / "report.xml"
    result = ct.gpuops("launch", "--junit", str(missing))
    assert result.code == 2 and f"--junit {missing}: the folder {missing.parent} does not exist" in result.err, result
    assert sshd.connection_count() == 0 and ct.run_dirs() == []
    dry = ct.gpuops("launch", "--dry-run", "--junit", str(tmp_path / "r.xml"))
    assert dry.code == 2 and "--junit does not apply to --dry-run" in dry.err, dry
    logs = ct.gpuops("logs", "--junit", str(tmp_path / "r.xml"))
    assert logs.code == 2 and "--junit needs --follow" in logs.err, logs
    assert "Traceback" not in result.err + dry.err + logs.err


# -- runs that end later: stall, --timeout, Ctrl-C, --detach then logs -f --------------------------


@pytest.mark.parametrize(("command", "options", "code", "outcome"), [
    (train("hang", "--steps", "3"), ("--json",), 8, "stalled"),  # three steps, then silent
    (train("steps", "--steps", "100000", "--interval", "0.2"), ("--json", "--timeout", "4"), 124, "timeout"),
], ids=["stall", "timeout"])  # fmt: skip
def test_a_stall_or_the_timeout_fails_training(ct: CtCli, tmp_path: Path, command: str, options: tuple[str, ...],
                                               code: int, outcome: str) -> None:
    playbook(ct, command, warmup=None, stall=2)
    path = tmp_path / "report.xml"
    result = ct.gpuops("launch", *options, "--junit", str(path))
    assert result.code == code, result
    failure = verdict(cases(report(path))["training"], "failure")
    assert (failure.get("type"), failure.get("message")) == (outcome, summary(result)["message"])


def test_ctrl_c_while_following_is_an_error_and_the_report_is_written(ct: CtCli, tmp_path: Path) -> None:
    playbook(ct, train("steps", "--steps", "100000", "--interval", "0.2"))
    path = tmp_path / "report.xml"
    running = ct.start("launch", "--junit", str(path))
    running.wait_for(lambda: "started run" in running.err and "step 1/" in running.out, "training to start")
    running.signal(signal.SIGINT)
    result = running.finish()
    assert result.code == 130, result
    got = cases(report(path))
    assert [v for v, _ in got.values()] == ["passed", "passed", "passed", "error"]
    error = verdict(got["training"], "error")
    assert error.get("type") == "interrupted" and "Reattach with: gpuops logs -f" in (error.get("message") or "")
    assert ct.gpuops("stop").code == 0


def test_ctrl_c_during_warmup_errors_that_gpu_and_skips_the_rest(ct: CtCli, tmp_path: Path) -> None:
    playbook(ct, train("steps"), warmup="fake-warmup --gpu {gpu} --duration 0.2 --steps 2 --mode hang")
    path = tmp_path / "report.xml"
    running = ct.start("launch", "--junit", str(path))
    running.wait_for(lambda: "warmup on GPU 5" in running.err, "the warmup on GPU 5 to start")
    running.signal(signal.SIGINT)
    result = running.finish()
    assert result.code == 130, result
    got = cases(report(path))
    assert verdict(got["warmup GPU 5"], "error").get("type") == "interrupted"
    assert got["preflight"][0] == "passed"
    assert got["warmup GPU 6"][0] == got["training"][0] == "skipped"


def test_detach_skips_training_and_logs_follow_reports_the_run(ct: CtCli, tmp_path: Path) -> None:
    playbook(ct, train("fx-thread", "--interval", "0.3"))
    started = tmp_path / "started.xml"
    result = ct.gpuops("launch", "--detach", "--junit", str(started))
    assert result.code == 0, result
    got = cases(report(started))
    assert [v for v, _ in got.values()] == ["passed", "passed", "passed", "skipped"]
    skipped = verdict(got["training"], "skipped").get("message") or ""
    assert skipped.startswith("detached: run ") and "gpuops logs -f --junit" in skipped
    followed = tmp_path / "followed.xml"
    attached = ct.gpuops("logs", "-f", "--json", "--junit", str(followed))
    assert attached.code == 7, attached
    got = cases(report(followed))
    assert [v for v, _ in got.values()] == ["passed", "passed", "passed", "failure"]
    assert got["warmup GPU 6"][1].findtext("system-out", "").startswith("done by the launcher of run ")
    failure = verdict(got["training"], "failure")
    said = summary(attached)
    assert (failure.get("type"), failure.get("message")) == (said["outcome"], said["message"])
    assert "rule: fx-tracing-race" in (failure.text or "") and FX_LINE in (failure.text or "")


def test_sigterm_before_the_command_got_going_reports_terminated_not_interrupted(tmp_path: Path) -> None:
    # A CI cancel can land while files still load: the report must say what the exit code says (143).
    from gpuops.cli.reports.junit import Report
    from gpuops.cli.signals import Terminated

    path = tmp_path / "report.xml"
    with pytest.raises(Terminated):
        with Report(str(path), "launch", "ct200"):
            raise Terminated()
    suite = ET.parse(path).getroot().find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert (props["outcome"], props["exit_code"]) == ("terminated", "143")
    assert any(e.get("message") == "terminated by SIGTERM" for e in suite.iter("error"))


def test_every_verdict_validates_against_the_junit_xsd_and_the_root_has_no_skipped(tmp_path: Path) -> None:
    """A unit over junit.write: passed, failure, error and skipped testcases in one report; the XSD refuses
    <testsuites skipped=...> (what gpuops wrote before), so validating is what catches it."""
    import time

    import xmlschema

    from gpuops.cli.reports import junit

    suite = junit.Suite("ct200", "demo", (5,), "pve1", lambda text: text, time.time())
    suite.cases["preflight"].finish("passed", time.time())
    suite.cases["warmup GPU 5"].finish("error", time.time(), type="interrupted", message="Ctrl-C", detail="at step 2")
    suite.cases["training"].finish("failure", time.time(), type="fx-tracing-race", message="aborted", detail="trace")
    suite.cases["extra"] = junit.Case("extra", status="skipped", message="not run")
    path = tmp_path / "report.xml"
    junit.write(str(path), "launch", [suite])
    root = report(path)
    assert [c.get("name") for c in root.iter("testcase")] == ["preflight", "warmup GPU 5", "training", "extra"]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "1", "1")
    assert root.find("testsuite").get("skipped") == "1"
    root.set("skipped", "1")
    bad = tmp_path / "old.xml"
    ET.ElementTree(root).write(bad, encoding="utf-8", xml_declaration=True)
    with pytest.raises(xmlschema.XMLSchemaValidationError, match="skipped"):
        junit_xsd().validate(str(bad))
