"""Ansible's own ssh plugin builds each host's ssh argv from hostvars (stdin: {host: vars}; stdout:
{host: argv after `ssh`, the destination last}); run with the python that has ansible-core. Nothing connects."""

from __future__ import annotations

import json
import sys

from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader


def main() -> None:
    hostvars = json.load(sys.stdin)
    out = {}
    for name, variables in hostvars.items():
        conn = connection_loader.get("ssh", PlayContext())
        conn.set_options(var_options={**variables, "inventory_hostname": name})
        argv = [a.decode() if isinstance(a, bytes) else a for a in conn._build_command("ssh", "ssh")]
        out[name] = argv[1:] + [conn.get_option("host")]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
