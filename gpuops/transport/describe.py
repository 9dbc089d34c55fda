"""The connection each target will get, as ssh resolves it (no connection made): validate and dry-run show it."""

from __future__ import annotations

from typing import Any

from gpuops.config.model import Inventory, Target
from gpuops.transport.become import method_of


def connection(inventory: Inventory, target: Target) -> dict[str, Any]:
    """name, host, address, port, user, jumps (user@host:port, in order), identity_file, known_hosts,
    host_key_policy, ctid, gpus, become_user (who runs the job; null: the login user), become_method
    (runuser, sudo, su; null: none needed): after ~/.ssh/config, ssh args, group_vars and host_vars."""
    host = inventory.hosts[target.host]
    out: dict[str, Any] = {"name": target.name, "host": target.host, "transport": host.transport}
    if host.transport == "local":
        out.update(address=None, port=None, user=None, jumps=[], identity_file=None, known_hosts=None,
                   host_key_policy=None, jump_host_key_policies=[])
    else:
        from gpuops.transport.ssh.plan import plan_chain

        hops = plan_chain(host, inventory.hosts)
        last = hops[-1]
        out.update(address=last.hostname, port=last.port, user=last.user, jumps=[h.spelled() for h in hops[:-1]],
                   identity_file=host.identity_file or (last.keys[0] if last.keys else None),
                   known_hosts=last.known_hosts, host_key_policy=last.policy,
                   jump_host_key_policies=[h.policy for h in hops[:-1]])
        if last.proxy_command:
            out["proxy_command"] = last.proxy_command
    out.update(ctid=target.ctid, gpus=list(target.gpus), become_user=target.become_user, become_method=method_of(target))
    return out


def spelled(view: dict[str, Any]) -> str:
    """`ssh user@host:port -J hop1,hop2` (or `this machine`): one line for text output."""
    if view["transport"] == "local":
        return "this machine (local)"
    user_host = f"{view['user']}@{view['address']}:{view['port']}"
    jumps = f" -J {','.join(view['jumps'])}" if view["jumps"] else ""
    proxy = f" (ProxyCommand {view['proxy_command']})" if view.get("proxy_command") else ""
    return f"ssh {user_host}{jumps}{proxy}"
