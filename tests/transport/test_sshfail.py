"""What OpenSSH 9.2 printed (captured on the bench, LogLevel DEBUG1 where gpuops connects) read as gpuops' errors,
and `ssh -G`'s list values (UserKnownHostsFile) and ssh_config words read as ssh reads them. Pure units."""

from __future__ import annotations

import pytest

from gpuops.errors import AuthError, ChangedHostKey, SshFileError, UnknownHostKey
from gpuops.transport.ssh.openssh.fail import HopView, SshFailed, classify, fingerprint
from gpuops.transport.ssh.resolve import config_word, split_config_words, ssh_words

HOP = HopView("pve1", "[127.0.0.1]:2222", "~/.ssh/known_hosts", user="root")
SERVER_KEY = "debug1: Server host key: ssh-ed25519 SHA256:PZ8qoVGG604GUsF47di/8AN8onXx1/RD1fhIz3DnULs\n"


def read(said: str, hop: HopView = HOP, *, wait_refused: bool = False) -> object:
    return classify(said, hop, connect_timeout=10, wait_refused=wait_refused)


def test_an_unknown_host_key_carries_the_fingerprint_ssh_saw() -> None:
    error = read(SERVER_KEY + "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict "
                 "checking.\nHost key verification failed.\n")
    assert isinstance(error, UnknownHostKey)
    assert str(error).startswith("pve1: unknown host key for [127.0.0.1]:2222 (ssh-ed25519 SHA256:PZ8qoVGG604GUsF47di")
    unrecordable = HopView("pve1", "[127.0.0.1]:2222", "/ro/kh", cannot_record="permission denied")
    assert isinstance(read(SERVER_KEY + "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested "
                           "strict checking.\n", unrecordable), SshFileError)


def test_a_changed_host_key_names_both_keys(tmp_path) -> None:
    import base64

    blob = b"\x00\x00\x00\x0bssh-ed25519" + bytes(36)
    known = tmp_path / "kh"
    known.write_text(f"# a comment\n[127.0.0.1]:2222 ssh-ed25519 {base64.b64encode(blob).decode()}\n")
    said = (SERVER_KEY + "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
            f"Offending ED25519 key in {known}:2\n  remove with:\n"
            "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.\n"
            "Host key verification failed.\n")
    error = read(said)
    assert isinstance(error, ChangedHostKey)
    assert f"known_hosts has ssh-ed25519 {fingerprint(blob)}, the host presented ssh-ed25519 SHA256:PZ8q" in str(error)


@pytest.mark.parametrize("said, why, transient", [
    ("ssh: connect to host 127.0.0.1 port 1: Connection refused\n", "connection refused", False),
    ("ssh: Could not resolve hostname pve-alias: Name or service not known\n",
     "could not resolve hostname pve-alias (Name or service not known)", False),
    ("ssh: connect to host 10.0.0.9 port 22: No route to host\n", "no route to host (the host is down or unreachable)", True),
    ("ssh: connect to host 10.0.0.9 port 22: Connection timed out\n", "timed out (no answer within 10s)", True),
    ("Connection timed out during banner exchange\n", "no SSH banner within 10s", True),
])
def test_network_failures_say_their_cause(said: str, why: str, transient: bool) -> None:
    error = read(said)
    assert isinstance(error, SshFailed) and error.why.startswith(why) and error.transient is transient
    assert read(said, wait_refused=True).transient is (transient or "refused" in why)


@pytest.mark.parametrize("said", [
    "ControlPath too long ('/home/ops/" + "c" * 100 + "' >= 108 bytes)\n",
    'unix_listener: path "/home/ops/' + "c" * 100 + '.XXXXXXXXXXXXXXXX" too long for Unix domain socket\n',
])
def test_a_controlpath_too_long_for_a_socket_is_said_as_such_not_as_a_wrong_address(said: str) -> None:
    """Issue 35 item 11: these were "cannot connect", with the hint to check the address and port."""
    error = read(said)
    assert isinstance(error, SshFileError) and "ControlMaster socket: " in str(error), error
    assert "ControlPath" in (error.hint or "") and "address" not in (error.hint or "")


def test_a_refused_login_names_its_cause() -> None:
    denied = "root@127.0.0.1: Permission denied (publickey).\n"
    agent = HopView("pve1", "h", "kh", identity_agent="/run/agent.sock")
    error = read("debug1: get_agent_identities: ssh_get_authentication_socket: No such file or directory\n" + denied, agent)
    assert isinstance(error, AuthError) and "no agent answers at IdentityAgent /run/agent.sock" in str(error)
    error = read("debug1: Offering public key: /k/id-cert.pub ED25519-CERT SHA256:abc explicit\n" + denied)
    assert isinstance(error, AuthError) and "refused the certificate /k/id-cert.pub" in str(error)
    assert "ssh-keygen -L -f /k/id-cert.pub" in (error.hint or "")
    error = read("debug1: Server accepts key: /k/locked ED25519 SHA256:48a7 explicit\n" + denied)
    assert isinstance(error, AuthError) and "the key /k/locked needs a passphrase" in str(error)
    error = read("root@h: Permission denied (keyboard-interactive).\n")
    assert isinstance(error, AuthError) and "second factor" in str(error) and "ControlMaster" in (error.hint or "")


@pytest.mark.parametrize("printed, words", [
    ("/tmp/a b/kh /c", ["/tmp/a b/kh", "/c"]),  # OpenSSH 9.2 prints the words bare
    ('"/tmp/a b/kh" /c', ["/tmp/a b/kh", "/c"]),  # newer releases quote a word with a space
    ("~/.ssh/known_hosts ~/.ssh/known_hosts2", ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]),
])
def test_user_known_hosts_file_words_as_ssh_g_prints_them(printed: str, words: list[str]) -> None:
    assert ssh_words(printed) == words


def test_ssh_config_words_round_trip_through_quoting() -> None:
    assert split_config_words('"my conf/*.conf" b\\ c x\\ny \'s q\'') == ["my conf/*.conf", "b c", "x\\ny", "s q"]
    for word in ("/plain", "/a b", '/a "b"', "/back\\slash"):
        assert split_config_words(config_word(word)) == [word]
