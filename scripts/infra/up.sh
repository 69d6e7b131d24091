#!/usr/bin/env bash
# Bring up the real local infrastructure the tests and the demo use:
# apt packages, dockerd (no bridge: loopback only), a registry on 127.0.0.1:5000,
# the debootstrapped base image and the systemd+sshd test-host image.
# Idempotent and quick when everything is already up; safe to run concurrently
# (one flock serialises the whole script).
set -euo pipefail

STATE_DIR=${STACKBUILD_INFRA_DIR:-/var/tmp/stackbuild-infra}
DOCKER_SOCK=/var/run/docker.sock
REGISTRY_ADDR=127.0.0.1:5000
BASE_IMAGE=${STACKBUILD_BASE_IMAGE:-local/debian:bookworm}
TESTHOST_IMAGE=${STACKBUILD_TESTHOST_IMAGE:-local/stackbuild-testhost:bookworm}
SUITE=bookworm
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "infra: $*" >&2; }
die() { echo "infra: error: $*" >&2; exit 4; }

[ "$(id -u)" = 0 ] || die "run as root (dockerd, apt-get and debootstrap need it)"
mkdir -p "$STATE_DIR"

# The docker.io CLI (20.10) has BuildKit built in; a newer CLI on PATH may lack buildx.
DOCKER=/usr/bin/docker

ensure_packages() {
  local missing=()
  [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || missing+=(docker.io)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v pgrep >/dev/null 2>&1 || missing+=(procps)
  # the tests verify rendered units and dry-run patches on this machine too
  command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
  command -v patch >/dev/null 2>&1 || missing+=(patch)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # policy-rc.d keeps the packages' init scripts from starting docker.service with its
  # default 172.17.x bridge: we start dockerd ourselves, bridge-less.
  local policy_made=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy_made=1
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}" || { [ $policy_made = 1 ] && rm -f /usr/sbin/policy-rc.d; die "apt-get install ${missing[*]} failed"; }
  [ $policy_made = 1 ] && rm -f /usr/sbin/policy-rc.d
  return 0
}

docker_up() { "$DOCKER" info >/dev/null 2>&1; }

ensure_dockerd() {
  if docker_up; then
    "$DOCKER" network inspect bridge >/dev/null 2>&1 \
      && log "warning: the running dockerd has a default bridge; use --network host everywhere"
    return 0
  fi
  if pgrep -x dockerd >/dev/null; then
    log "dockerd is running but not answering yet; waiting"
  else
    log "starting dockerd (--bridge=none --iptables=false), log: $STATE_DIR/dockerd.log"
    # A stale pid file from a crashed daemon blocks the next start.
    [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null && rm -f /var/run/docker.pid
    nohup /usr/sbin/dockerd --bridge=none --iptables=false --ip-masq=false \
      --host "unix://$DOCKER_SOCK" >>"$STATE_DIR/dockerd.log" 2>&1 </dev/null 9>&- &
  fi
  for _ in $(seq 1 120); do
    docker_up && return 0
    sleep 0.5
  done
  tail -n 20 "$STATE_DIR/dockerd.log" >&2 || true
  die "dockerd did not answer on $DOCKER_SOCK within 60 s (log: $STATE_DIR/dockerd.log)"
}

registry_up() { curl -fs -o /dev/null --max-time 2 "http://$REGISTRY_ADDR/v2/"; }

ensure_registry() {
  registry_up && return 0
  local dir=$STATE_DIR/registry
  mkdir -p "$dir/data"
  cat >"$dir/config.yml" <<CFG
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $dir/data}
  delete: {enabled: true}
http: {addr: $REGISTRY_ADDR}
CFG
  log "starting registry on $REGISTRY_ADDR (storage $dir/data), log: $dir/registry.log"
  nohup docker-registry serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 </dev/null 9>&- &
  for _ in $(seq 1 60); do
    registry_up && return 0
    sleep 0.5
  done
  tail -n 20 "$dir/registry.log" >&2 || true
  die "registry did not answer http://$REGISTRY_ADDR/v2/ within 30 s (log: $dir/registry.log)"
}

# The Debian mirror this machine already uses: deb822 *.sources first, then
# one-line *.list files, then /etc/apt/sources.list. Security suites are skipped.
apt_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk -v suite="$SUITE" '
      /^[[:space:]]*#/ {next}
      /^[[:space:]]*$/ { if (u != "" && s ~ ("(^| )" suite "( |$)")) { print u; exit } u=""; s=""; next }
      tolower($1) == "uris:" { u=$2 }
      tolower($1) == "suites:" { $1=""; s=$0 }
      END { if (u != "" && s ~ ("(^| )" suite "( |$)")) print u }' "$f" | head -n1)
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
    [ -f "$f" ] || continue
    uri=$(awk -v suite="$SUITE" '$1 == "deb" { i=2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                                   if ($(i+1) == suite) { print $i; exit } }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  return 1
}

image_present() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

ensure_base_image() {
  image_present "$BASE_IMAGE" && return 0
  local mirror rootfs
  mirror=$(apt_mirror) || die "no '$SUITE' mirror found in /etc/apt/sources.list.d/ or /etc/apt/sources.list"
  rootfs=$(mktemp -d "$STATE_DIR/rootfs.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" RETURN
  log "debootstrap --variant=minbase $SUITE from $mirror (about 30 s)"
  debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$STATE_DIR/debootstrap.log" 2>&1 \
    || { tail -n 20 "$STATE_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $STATE_DIR/debootstrap.log)"; }
  # Keep images small and apt quiet inside builds.
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/90stackbuild"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  # Import under a temporary tag, then retag: an interrupted import leaves no half image under the real name.
  tar -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    - "$BASE_IMAGE-partial" >/dev/null
  "$DOCKER" tag "$BASE_IMAGE-partial" "$BASE_IMAGE"
  "$DOCKER" rmi "$BASE_IMAGE-partial" >/dev/null
  log "built $BASE_IMAGE"
}

# The image is rebuilt when its sources change: it carries their hash as a label.
testhost_hash() { cat "$HERE"/testhost/* | sha256sum | cut -c1-16; }
testhost_current() {
  [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "dev.stackbuild.testhost"}}' "$TESTHOST_IMAGE" 2>/dev/null)" \
    = "$(testhost_hash)" ]
}

ensure_testhost_image() {
  testhost_current && return 0
  log "building $TESTHOST_IMAGE (systemd + sshd + python3)"
  DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
    --label "dev.stackbuild.testhost=$(testhost_hash)" \
    --build-arg "BASE=$BASE_IMAGE" -t "$TESTHOST_IMAGE" "$HERE/testhost" \
    >"$STATE_DIR/testhost-build.log" 2>&1 \
    || { tail -n 30 "$STATE_DIR/testhost-build.log" >&2; die "test-host image build failed (log: $STATE_DIR/testhost-build.log)"; }
}

all_up() {
  [ -x "$DOCKER" ] && docker_up && registry_up && image_present "$BASE_IMAGE" && testhost_current && inotify_room
}

# Each test host runs its own systemd, and every systemd takes inotify instances; the
# kernel's default of 128 per user runs out with about ten hosts up at once (the tests
# run several side by side), and units then fail at boot. Raised where we may.
INOTIFY_INSTANCES=1024
inotify_room() { [ "$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo 0)" -ge "$INOTIFY_INSTANCES" ]; }
ensure_inotify() {
  inotify_room && return 0
  sysctl -qw "fs.inotify.max_user_instances=$INOTIFY_INSTANCES" 2>/dev/null \
    || log "warning: could not raise fs.inotify.max_user_instances to $INOTIFY_INSTANCES; many test hosts at once may fail to boot"
}

if all_up; then
  log "already up: dockerd, registry http://$REGISTRY_ADDR, $BASE_IMAGE, $TESTHOST_IMAGE"
  exit 0
fi
# Daemons started below must not inherit fd 9, or they would hold the lock forever.
exec 9>"$STATE_DIR/infra.lock"
flock -w 900 9 || die "another up.sh holds $STATE_DIR/infra.lock for more than 15 min"

ensure_packages
ensure_inotify
ensure_dockerd
ensure_registry
ensure_base_image
ensure_testhost_image
log "up: dockerd ($DOCKER_SOCK), registry http://$REGISTRY_ADDR, $BASE_IMAGE, $TESTHOST_IMAGE"
