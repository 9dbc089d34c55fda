#!/usr/bin/env bash
# Make a bare GPU machine (no network) ready for the real-sshd bench: the OpenSSH server and client
# and tmux from the Debian packages carried in .whl/ (their libraries are found after the system's
# own), the sshd privilege-separation user, and gpuops' Python dependencies from the carried wheels.
# .whl holds: openssh-server/client/sftp-server, tmux, libevent-core, libutempter0, libwrap0, libtirpc3,
# libtirpc-common, libnsl2 (bookworm; sshd needs libnsl.so.2, which the GPU machine lacked on 2026-12-06) and the wheels.
# Usage: bash tools/device_setup.sh [WHEEL_DIR]   then: export PYTHONPATH=/tmp/site
set -eu
W=${1:-.whl}
D=/opt/gpuops-debs
mkdir -p "$D"
for deb in "$W"/*.deb; do dpkg -x "$deb" "$D"; done
printf "%s\n" "$D/usr/lib/x86_64-linux-gnu" "$D/lib/x86_64-linux-gnu" >/etc/ld.so.conf.d/zz-gpuops-debs.conf
ldconfig
link() {  # link NAME DIR: the carried binary, unless the machine has one
  command -v "$1" >/dev/null 2>&1 && [ -e "$2/$1" ] && return 0
  [ -e "$2/$1" ] || ln -s "$D$2/$1" "$2/$1"
}
link sshd /usr/sbin
link ssh /usr/bin
link ssh-keygen /usr/bin
link tmux /usr/bin
id sshd >/dev/null 2>&1 || echo 'sshd:x:997:65534::/run/sshd:/usr/sbin/nologin' >>/etc/passwd
mkdir -p /run/sshd
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$W"/*.whl 2>&1 | grep -v WARNING || true
/usr/sbin/sshd -V 2>&1 | head -1
tmux -V
