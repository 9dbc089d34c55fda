"""Ansible's own ssh plugin builds each host's ssh argv from hostvars, and its become plugins say who a task
runs as (stdin: {host: vars}; stdout: {"argv": {host: argv after `ssh`, the destination last}, "become": {host:
{"user": USER or null, "method": NAME}}}); run with the python that has ansible-core. Nothing connects."""

from __future__ import annotations

import json
import sys

from ansible import constants as C
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import become_loader, connection_loader


def become(variables: dict) -> dict:
    """As TaskExecutor._set_become_plugin and _set_plugin_options do for a task without become keywords."""
    if variables.get("ansible_become") is None or not boolean(variables["ansible_become"]):
        return {"user": None, "method": None}
    plugin = become_loader.get(variables.get("ansible_become_method") or C.DEFAULT_BECOME_METHOD)
    names = C.config.get_plugin_vars("become", plugin._load_name)
    plugin.set_options(task_keys={}, var_options={k: variables[k] for k in names if k in variables})
    return {"user": plugin.get_option("become_user"), "method": plugin.name}


def main() -> None:
    hostvars = json.load(sys.stdin)
    out: dict = {"argv": {}, "become": {}}
    for name, variables in hostvars.items():
        out["become"][name] = become(variables)
        conn = connection_loader.get("ssh", PlayContext())
        conn.set_options(var_options={**variables, "inventory_hostname": name})
        argv = [a.decode() if isinstance(a, bytes) else a for a in conn._build_command("ssh", "ssh")]
        out["argv"][name] = argv[1:] + [conn.get_option("host")]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
