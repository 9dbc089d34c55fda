"""An Ansible host's become variables as Ansible's task executor and become plugins read them: who runs the job.

ansible_become (false unless set; Ansible's boolean), ansible_become_method (sudo unless set), the user from
the method's own variables (sudo: ansible_become_user, ansible_sudo_user; su: ansible_become_user,
ansible_su_user; the last set one wins, as Ansible's config manager takes them; root unless set). A become
variable left unset costs nothing; one gpuops cannot use fails only the targets of that host (HostValueError).
"""

from __future__ import annotations

from gpuops.config import schema as s
from gpuops.config.ansible.tree import HostValueError, Var, first_set

METHODS = {"sudo": "sudo", "ansible.builtin.sudo": "sudo", "ansible.legacy.sudo": "sudo",
           "su": "su", "ansible.builtin.su": "su", "ansible.legacy.su": "su"}  # fmt: skip
USER_VARS = {"sudo": ("ansible_sudo_user", "ansible_become_user"), "su": ("ansible_su_user", "ansible_become_user")}


def become_of(v: dict[str, Var]) -> tuple[str | None, str]:
    """(the user the job runs as, or None for the login user; the method: sudo or su)."""
    flag = first_set(v, "ansible_become")
    if flag is None or not flag.boolean("ansible_become"):
        return None, "sudo"
    method_var = first_set(v, "ansible_become_method")
    method = "sudo"
    if method_var is not None:
        name = method_var.text("a become method")
        if name not in METHODS:
            raise HostValueError(method_var.mark, f"become method {name!r}: gpuops becomes with sudo or su on a host "
                                                  "(runuser in a container); set ansible_become_method to one of them")
        method = METHODS[name]
    user_var = first_set(v, *USER_VARS[method])
    user = user_var.matching(s.USER, "a user name") if user_var is not None else "root"
    return user, method
