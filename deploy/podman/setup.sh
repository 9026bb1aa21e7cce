#!/usr/bin/env bash
# Run compose.yaml with Debian's podman and docker-compose on a host without a Docker engine
# (root; the settings in ../shared/NOTES.md, checked on the development machines):
#   - packages: podman, docker-compose (1.29, Python), debootstrap, runc, the dnsname CNI plugin
#     (service names resolve between containers);
#   - /etc/containers/containers.conf: the runc runtime and the cgroupfs manager (crun fails on
#     hybrid cgroups), ulimits under the host's hard limits;
#   - `podman system service` on unix:///run/podman/podman.sock, the Docker API docker-compose uses.
# Prints the DOCKER_HOST to export. Idempotent: a second run changes nothing.
set -euo pipefail
[[ $(id -u) -eq 0 ]] || { echo "setup.sh: run as root (rootful podman serves the Docker API socket)" >&2; exit 1; }

need=()
command -v podman >/dev/null || need+=(podman)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v runc >/dev/null || need+=(runc)
command -v mvn >/dev/null || need+=(maven)
command -v curl >/dev/null || need+=(curl)
[[ -e /usr/lib/cni/dnsname ]] || need+=(golang-github-containernetworking-plugin-dnsname)
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # With recommends: podman needs slirp4netns, uidmap, fuse-overlayfs and catatonit as tested.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

conf=/etc/containers/containers.conf
if ! grep -q '^runtime = "runc"' "$conf" 2>/dev/null; then
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [[ "$nofile" == unlimited ]] && nofile=1048576
  [[ "$nproc" == unlimited ]] && nproc=65536
  ((nofile > 65536)) && nofile=65536
  ((nproc > 4096)) && nproc=4096
  mkdir -p /etc/containers
  cat > "$conf" <<CONF
# Written by deploy/podman/setup.sh: what podman needs to run containers on this kind of host.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
fi

socket=/run/podman/podman.sock
if ! curl -s --unix-socket "$socket" http://d/_ping 2>/dev/null | grep -q OK; then
  mkdir -p /run/podman
  # From /: the service outlives this checkout, and conmon fails every later start ("Failed to get
  # working directory") once the directory it was started from is gone.
  nohup env --chdir=/ podman system service --time=0 "unix://$socket" > /var/log/strata-podman-service.log 2>&1 &
  for _ in $(seq 50); do
    curl -s --unix-socket "$socket" http://d/_ping 2>/dev/null | grep -q OK && break
    sleep 0.2
  done
  curl -s --unix-socket "$socket" http://d/_ping | grep -q OK \
    || { echo "setup.sh: podman's API did not come up; see /var/log/strata-podman-service.log" >&2; exit 1; }
fi
echo "DOCKER_HOST=unix://$socket"
