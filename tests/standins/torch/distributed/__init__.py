"""A strict stand-in for ``torch.distributed.TCPStore``, the one piece of torch.distributed gpuops' job link
uses (gpuops/agent/run/jobstore.py), as PyTorch 2.11 spells it: a client of the store the torchrun
stand-in hosts on the rendezvous endpoint (tests/standins/bin/torchrun). And, for trainers on the bench,
``init_process_group``, ``get_rank``, ``get_world_size`` and a blocking ``all_reduce`` of a number
(no tensors here) through that store: each rank posts its value under the collective's sequence number and
waits for every rank's, as gloo's all_reduce waits for its peers (a rank that never calls it leaves the
others waiting until the group's timeout). This stand-in torch has no Flight Recorder (no ``torch._C``).
"""

from datetime import timedelta

from . import _store


class DistStoreError(RuntimeError):
    """torch.distributed.DistStoreError: a store operation timed out."""


def _seconds(timeout):
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _text(value):
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


class TCPStore:
    def __init__(self, host_name, port, world_size=None, is_master=False, timeout=timedelta(seconds=300),
                 wait_for_workers=True, multi_tenant=False, master_listen_fd=None, use_libuv=True):
        if not isinstance(port, int) or not 0 < port < 65536:
            raise TypeError("port must be an int in 1..65535")
        if is_master:
            raise NotImplementedError("the stand-in TCPStore is a client only (the torchrun stand-in hosts the store)")
        self.timeout = _seconds(timeout)
        self._c = _store.Client(host_name, port, self.timeout)

    def set(self, key, value):
        self._c.call(op="set", key=key, value=_text(value))

    def get(self, key):
        reply = self._c.call(op="get", key=key, timeout=self.timeout)
        if not reply["ok"]:
            raise DistStoreError("wait timeout after %dms, keys: /%s" % (self.timeout * 1000, key))
        return reply["value"].encode()

    def compare_set(self, key, expected_value, desired_value):
        return self._c.call(op="cas", key=key, expected=_text(expected_value), desired=_text(desired_value))["value"].encode()

    def add(self, key, amount):
        return self._c.call(op="add", key=key, amount=int(amount))["value"]

    def check(self, keys):
        return bool(self._c.call(op="check", keys=list(keys))["value"])

    def wait(self, keys, timeout=None):
        seconds = self.timeout if timeout is None else _seconds(timeout)
        if not self._c.call(op="wait", keys=list(keys), timeout=seconds)["ok"]:
            raise DistStoreError("wait timeout after %dms, keys: %s" % (seconds * 1000, ", ".join("/" + k for k in keys)))


_group = {}


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, **_):
    """The default group over torchrun's store (MASTER_ADDR/MASTER_PORT); RANK and WORLD_SIZE from the env."""
    import os

    seconds = _seconds(timeout) if timeout is not None else 1800.0
    _group.update(rank=int(os.environ["RANK"]) if rank < 0 else rank,
                  world=int(os.environ["WORLD_SIZE"]) if world_size < 0 else world_size, seq=0, timeout=seconds,
                  prefix="pg/%s/" % os.environ.get("TORCHELASTIC_RUN_ID", "none"), backend=backend or "gloo",
                  store=_store.Client(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 60))


def get_rank():
    return _group["rank"]


def get_world_size():
    return _group["world"]


def all_reduce(value):
    """The sum of every rank's value for this call (blocks until every rank made its call of that number)."""
    import json

    g = _group
    g["seq"] += 1
    key = "%sall_reduce/%d/" % (g["prefix"], g["seq"])
    g["store"].call(op="set", key=key + str(g["rank"]), value=json.dumps(value))
    keys = [key + str(r) for r in range(g["world"])]
    if not g["store"].call(op="wait", keys=keys, timeout=g["timeout"])["ok"]:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting %dms for "
                           "recv operation to complete" % (g["timeout"] * 1000))
    return sum(json.loads(g["store"].call(op="get", key=k, timeout=1)["value"]) for k in keys)
