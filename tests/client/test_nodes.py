"""One job over several targets (launch.nodes, launch.torchrun): the keys, node 0's address, each node's
torchrun command as --dry-run shows it, and the job's one outcome read from its nodes' records."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from bench.cli import gpuops
from bench.playbooks import playbook_error

from gpuops.agent.wire import jobwire
from gpuops.agent.wire.records import outcome
from gpuops.client.nodes import NodeEnd, first_failing, job_outcome
from gpuops.config import load_playbook

INVENTORY = {
    "hosts": {"pve1": {"address": "192.0.2.10", "user": "root"}, "pve2": {"address": "192.0.2.11", "user": "root"},
              "gpubox": {"address": "192.0.2.20", "user": "ops"}},
    "targets": {"ct200": {"host": "pve1", "ctid": 200, "gpus": [0, 1]},
                "ct201": {"host": "pve2", "ctid": 201, "gpus": [0, 1], "rdzv_address": "10.10.0.201"},
                "bare": {"host": "gpubox"}},
}


def files(tmp_path: Path, launch: dict, inventory: dict = INVENTORY) -> tuple[Path, Path]:
    inv, pb = tmp_path / "inv.yaml", tmp_path / "pb.yaml"
    inv.write_text(yaml.safe_dump(inventory))
    pb.write_text(yaml.safe_dump({"name": "two", "launch": {"session": "train", "command": "train.py --cfg 'a b.yaml'",
                                                              **launch}}, sort_keys=False))
    return inv, pb


def torchrun_lines(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line.startswith("torchrun ")]


def test_dry_run_of_two_nodes_shows_torchrun_on_each_with_its_rank_and_node_0s_endpoint(tmp_path: Path) -> None:
    inv, pb = files(tmp_path, {"nodes": ["ct201", "ct200"], "torchrun": {"nproc_per_node": 2, "port": 29411}})
    result = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb))
    assert result.code == 0, result
    lines = torchrun_lines(result.text)
    assert len(lines) == 2
    for rank, argv in enumerate(lines):
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nproc-per-node") + 1] == "2"
        assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.10.0.201:29411"  # node 0's rdzv_address
        assert argv[-3:] == ["train.py", "--cfg", "a b.yaml"]  # the playbook's command, as written
    assert "# node 0 (ct201)" in result.text and "# node 1 (ct200)" in result.text
    assert result.text.count("pct exec 201 --") > 3 and result.text.count("pct exec 200 --") > 3  # each node's launch


def test_a_container_without_rdzv_address_is_asked_for_its_address_at_launch(tmp_path: Path) -> None:
    inv, pb = files(tmp_path, {"nodes": ["ct200", "bare"], "torchrun": {"port": 29400}})
    result = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb))
    assert result.code == 0, result
    assert "--rdzv-endpoint NODE0_ADDRESS:29400 " in result.text  # one shell word, said where it comes from
    assert "# NODE0_ADDRESS: the first address this prints on ct200, asked at launch" in result.text
    assert "pct exec 200 -- hostname -I" in result.text
    inv, pb = files(tmp_path, {"nodes": ["bare", "ct200"], "torchrun": {}})
    lines = torchrun_lines(gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb)).text)
    assert lines[0][lines[0].index("--rdzv-endpoint") + 1] == "192.0.2.20:29400"  # an ssh host: its address


def test_nccl_safety_variables_the_env_sets_stay_set(tmp_path: Path) -> None:
    inv, pb = files(tmp_path, {"nodes": ["ct201", "ct200"], "torchrun": {"collective_timeout": 120}})
    data = yaml.safe_load(pb.read_text())
    data["env"] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "NCCL_NVLS_ENABLE": "0"}
    pb.write_text(yaml.safe_dump(data))
    result = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb))
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3\\n" in result.text and "ERROR_HANDLING=1" not in result.text
    assert "export NCCL_NVLS_ENABLE=0\\n" in result.text and "export GPUOPS_COLLECTIVE_TIMEOUT=120\\n" in result.text
    data["env"] = {}
    pb.write_text(yaml.safe_dump(data))
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1\\n" in gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb)).text


@pytest.mark.parametrize("launch, message", [
    ({"nodes": ["ct200"], "torchrun": {}}, "expected at least two targets in launch.nodes"),
    ({"nodes": ["ct200", "ct200"], "torchrun": {}}, "target 'ct200' is already node 0"),
    ({"nodes": ["ct200", "ct201"]}, "launch.nodes needs launch.torchrun"),
    ({"torchrun": {"port": 29400}}, "launch.torchrun needs launch.nodes"),
    ({"nodes": ["ct200", "ct201"], "torchrun": {"port": 70000}}, "expected the rendezvous port on node 0"),
    ({"nodes": ["ct200", "ct201"], "torchrun": {"nproc_per_node": 0}}, "expected the number of worker processes"),
    ({"nodes": ["ct200", "ct201"], "torchrun": {"nprocs": 2}}, "nprocs"),
])
def test_bad_nodes_or_torchrun_keys_are_one_message_at_their_line(tmp_path: Path, launch: dict, message: str) -> None:
    _, pb = files(tmp_path, launch)
    assert message in playbook_error(str(pb))


def test_a_node_the_inventory_lacks_is_an_error_at_its_line_exit_2(tmp_path: Path) -> None:
    inv, pb = files(tmp_path, {"nodes": ["ct200", "ct299"], "torchrun": {}})
    result = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb))
    assert result.code == 2 and f"{pb}:7:5:" in result.err and "'ct299', which is not a target" in result.err, result
    assert "Traceback" not in result.err


def test_validate_refuses_a_node_the_inventory_lacks_as_launch_does(tmp_path: Path) -> None:
    """Issue 35 item 11: validate passed what launch refused."""
    inv, pb = files(tmp_path, {"nodes": ["ct200", "ct299"], "torchrun": {}})
    result = gpuops("validate", "-i", str(inv), "-p", str(pb))
    assert result.code == 2 and f"{pb}:7:5: launch.nodes names 'ct299', which is not a target" in result.err, result
    inv, pb = files(tmp_path, {"nodes": ["ct200", "ct201"], "torchrun": {}})
    result = gpuops("validate", "-i", str(inv), "-p", str(pb))
    assert result.code == 0 and f"ok: nodes ct200, ct201 found in {inv}" in result.text, result


def test_target_beside_launch_nodes_is_an_error_at_its_line(tmp_path: Path) -> None:
    """Issue 35 item 11: `target:` beside launch.nodes was ignored without a word (the job runs on its nodes)."""
    _, pb = files(tmp_path, {"nodes": ["ct200", "ct201"], "torchrun": {}})
    pb.write_text("target: ct200\n" + pb.read_text())
    assert playbook_error(str(pb)).startswith("1:9: target beside launch.nodes: a job over launch.nodes runs on its "
                                              "nodes and `target:` would be ignored")


def test_rdzv_address_must_be_an_address(tmp_path: Path) -> None:
    bad = {**INVENTORY, "targets": {**INVENTORY["targets"], "ct200": {"host": "pve1", "rdzv_address": "a b"}}}
    inv, pb = files(tmp_path, {"nodes": ["ct200", "ct201"], "torchrun": {}}, bad)
    result = gpuops("validate", "-i", str(inv), "-p", str(pb))
    assert result.code == 2 and "an address the other nodes reach this target by" in result.err, result


def test_the_playbook_model_carries_nodes_in_rank_order(tmp_path: Path) -> None:
    _, pb = files(tmp_path, {"nodes": ["ct201", "ct200"], "torchrun": {"nproc_per_node": 8, "port": 29500}})
    launch = load_playbook(str(pb)).launch
    assert launch.nodes == ("ct201", "ct200") and launch.torchrun.nproc_per_node == 8 and launch.torchrun.port == 29500


# -- the job's one outcome -------------------------------------------------------------------------
def end(name: str, rank: int, abort: dict | None, exit_text: str | None) -> NodeEnd:
    state, code = outcome(exit_text, abort, False)
    return NodeEnd(name, rank, state.value, code, abort)


def test_the_job_ends_with_the_first_failing_nodes_code_and_names_it() -> None:
    fx = {"reason": "match", "rule": "fx-tracing-race", "time": "2026-12-03T10:00:01Z", "excerpt": "RuntimeError: ..."}
    by_job = {"reason": "job", "first_node": "ct201", "first_reason": "match", "rule": "fx-tracing-race"}
    ends = [end("ct200", 0, by_job, "1"), end("ct201", 1, fx, "130")]
    out = job_outcome("r1", ends)
    assert out.exit_code == 7 and out.data["first_failing_node"] == "ct201" and "node ct201 (rank 1)" in out.message
    assert [n["exit_code"] for n in out.data["nodes"]] == [7, 7]  # node 0 ended by the job carries its cause
    stall = {"reason": "job", "first_node": "ct200", "first_reason": "stall", "rule": "stall"}
    assert outcome("1", stall, False)[1] == 8
    failed = [end("ct200", 0, None, "1"), end("ct201", 1, None, "1")]
    assert first_failing(failed).name == "ct200"  # no node recorded first: the first by rank
    assert job_outcome("r1", [end("ct200", 0, None, "0"), end("ct201", 1, None, "0")]).exit_code == 0


def test_the_jobs_end_record_is_signed_with_the_runs_key_and_bound_to_its_attempt_and_node() -> None:
    text = jobwire.sign("k1", {"node": "ct201", "reason": "match"})
    assert jobwire.verify("k1", text) == {"node": "ct201", "reason": "match"}
    assert jobwire.verify("k2", text) is None and jobwire.verify("k1", text.replace("ct201", "ct200")) is None
    assert jobwire.rdzv_id("r", 1) == "r" and jobwire.rdzv_id("r", 2) == "r-a2"
    nodes = ("ct200", "ct201")
    one, two = jobwire.Attempt("r", "r", nodes), jobwire.Attempt("r", "r-a2", nodes)
    end = {"node": "ct201", "node_rank": 1, "reason": "match", "attempt": 1}
    assert jobwire.check("k1", jobwire.seal("k1", end, one), one)[0]["node"] == "ct201"
    assert "replayed" in str(jobwire.check("k1", jobwire.seal("k1", end, one), two)[1])  # attempt 1's end in attempt 2
    assert jobwire.check("k1", jobwire.seal("k1", end, one), jobwire.Attempt("r2", "r", nodes))[0] is None  # another run
    assert jobwire.check("k1", jobwire.seal("k1", {**end, "attempt": 2}, one), one)[0] is None  # says another attempt
    assert jobwire.check("k1", jobwire.seal("k1", {**end, "node_rank": 0}, one), one)[0] is None  # not that node's rank
    assert jobwire.check("k1", '{"node": "ct201", "reason": "match"}', one) == (None, "not signed with this run's key")
    assert [jobwire.store_key("r", n) for n in (1, 2)] == ["gpuops/job/r/end", "gpuops/job/r/end/2"]


def job_env(tmp_path: Path, torchrun: dict, env: dict | None = None, watch: dict | None = None) -> dict[str, str]:
    """What a node's training gets exported (the playbook's env and the job's own), as node_env composes it."""
    from gpuops.client.nodes import node_env

    _, pb = files(tmp_path, {"nodes": ["ct201", "ct200"], "torchrun": torchrun})
    data = yaml.safe_load(pb.read_text())
    data.update({"env": env or {}, **({"watch": watch} if watch else {})})
    pb.write_text(yaml.safe_dump(data))
    return {v.name: v.value for v in node_env(load_playbook(str(pb)))}


def test_the_flight_recorder_is_on_unless_the_env_sets_its_buffer_and_the_collective_timeout_follows_the_stall(
        tmp_path: Path) -> None:
    env = job_env(tmp_path, {})
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "300"
    assert env["GPUOPS_COLLECTIVE_TIMEOUT"] == "960"  # the stall clock (900 s) fires first, the engine 60 s later
    assert job_env(tmp_path, {}, {"TORCH_FR_BUFFER_SIZE": "64"})["TORCH_FR_BUFFER_SIZE"] == "64"  # the env's wins
    older = job_env(tmp_path, {}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"})
    assert "TORCH_FR_BUFFER_SIZE" not in older and older["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "100"
    assert "TORCH_FR_BUFFER_SIZE" not in job_env(tmp_path, {"flight_recorder": False})
    assert job_env(tmp_path, {}, watch={"stall_timeout": 0})["GPUOPS_COLLECTIVE_TIMEOUT"] == "600"
    assert job_env(tmp_path, {"collective_timeout": 120})["GPUOPS_COLLECTIVE_TIMEOUT"] == "120"
    kept = job_env(tmp_path, {}, {"GPUOPS_COLLECTIVE_TIMEOUT": "30", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90"})
    assert (kept["GPUOPS_COLLECTIVE_TIMEOUT"], kept["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) == ("30", "90")
