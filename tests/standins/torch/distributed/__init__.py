"""A strict stand-in for ``torch.distributed.TCPStore``, the one piece of torch.distributed gpuops' job link
uses (gpuops/agent/run/jobstore.py), as PyTorch 2.11 spells it: a client of the store the torchrun
stand-in hosts on the rendezvous endpoint (tests/standins/bin/torchrun)."""

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
