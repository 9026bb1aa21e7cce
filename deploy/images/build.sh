#!/usr/bin/env bash
# Build every image compose.yaml runs, from Debian packages and Maven Central, with no image
# registry: a debootstrapped Debian base, then Python (for the Strata Dockerfile), Kafka, Redis and
# Prometheus, tagged as the registry names compose.yaml uses so that the same file runs here and on
# a GPU host that pulls the official images. Needs podman (deploy/podman/setup.sh), debootstrap, mvn.
#
#   deploy/images/build.sh            build what is missing or stale (each image is labelled with a
#                                     hash of its inputs; an unchanged one is kept)
#   deploy/images/build.sh --force    rebuild everything
#   deploy/images/build.sh --infra    Kafka and Redis only (`make test-containers`); with --force too
#
# Behind a TLS-intercepting proxy (pip fails with CERTIFICATE_VERIFY_FAILED in the build), set
# STRATA_BUILD_CA to the host's CA bundle: it is mounted into the build steps, never baked in.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
force=0
infra_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --infra) infra_only=1 ;;
    *) echo "build.sh: unknown option $arg (--force, --infra)" >&2; exit 2 ;;
  esac
done

debian_image=localhost/debian:bookworm
python_image=localhost/strata-python:3.11-bookworm
# The registry names compose.yaml uses (read from it, so the two cannot drift apart).
image_of() { sed -n "/^  $1:/,/^  [a-z]/{s/^    image: *//p}" "$root/compose.yaml" | head -1; }
kafka_image="$(image_of kafka)"
redis_image="$(image_of redis)"
prometheus_image="$(image_of prometheus)"
strata_image="${STRATA_IMAGE:-strata:latest}"
for name in kafka_image redis_image prometheus_image; do
  [[ -n "${!name}" ]] || { echo "build.sh: no image for ${name%_image} in compose.yaml" >&2; exit 1; }
done

log() { printf '== [%s] %s\n' "$(date +%T)" "$*"; }
# The CA bundle pip trusts here (STRATA_BUILD_CA, else PIP_CERT, else /etc/pip.conf's cert): hosts
# whose TLS is re-signed by a CA only they trust need it mounted into pip's build steps.
build_ca="${STRATA_BUILD_CA:-${PIP_CERT:-$(sed -n 's/^ *cert *= *//p' /etc/pip.conf 2>/dev/null | head -1)}}"
ca_mount=()
if [[ -n "$build_ca" ]]; then
  [[ -f "$build_ca" ]] || { echo "build.sh: CA bundle $build_ca does not exist (STRATA_BUILD_CA)" >&2; exit 1; }
  ca_mount=(-v "$build_ca:/etc/ssl/certs/build-ca.crt:ro" --build-arg PIP_CERT=/etc/ssl/certs/build-ca.crt)
fi

# Docker's short names resolve to docker.io; podman's compat API (what docker-compose talks to)
# does the same, so every image is tagged under both spellings.
qualified() {
  case "$1" in
    localhost/*|*.*/*) echo "$1" ;;
    */*) echo "docker.io/$1" ;;
    *) echo "docker.io/library/$1" ;;
  esac
}

inputs_hash() { (cd "$root" && cat "$@" | sha256sum | cut -c1-16); }
current_hash() { podman image inspect --format '{{index .Labels "dev.strata.inputs"}}' "$1" 2>/dev/null || true; }

# build IMAGE HASH CONTEXT [podman build args...]: skip when IMAGE exists with the same input hash.
build() {
  local image="$1" hash="$2" context="$3"
  shift 3
  if ((force == 0)) && [[ "$(current_hash "$image")" == "$hash" ]]; then
    log "$image: up to date ($hash)"
    return
  fi
  log "$image: building ($hash)"
  local started=$SECONDS
  podman build --quiet --format docker --label "dev.strata.inputs=$hash" --build-arg "DEBIAN_IMAGE=$debian_image" \
    "$@" -t "$image" "$context" >/dev/null
  local qualified_name
  qualified_name="$(qualified "$image")"
  [[ "$qualified_name" == "$image" ]] || podman tag "$image" "$qualified_name"
  log "$image: built in $((SECONDS - started)) s, $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec)"
}

if ((force == 1)) || ! podman image exists "$debian_image"; then
  log "$debian_image: debootstrap --variant=minbase bookworm"
  started=$SECONDS
  rootfs="$(mktemp -d /var/tmp/strata-debian.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase bookworm "$rootfs" "${STRATA_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    > "$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; exit 1; }
  tar -C "$rootfs" -c . | podman import --quiet - "$debian_image" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  trap - EXIT
  log "$debian_image: imported in $((SECONDS - started)) s"
else
  log "$debian_image: present"
fi

((infra_only == 1)) || build "$python_image" "$(inputs_hash deploy/images/python/Containerfile)" "$here/python" \
  -f "$here/python/Containerfile"
build "$redis_image" "$(inputs_hash deploy/images/redis/Containerfile deploy/images/redis/entrypoint.sh)" \
  "$here/redis" -f "$here/redis/Containerfile"
((infra_only == 1)) || build "$prometheus_image" "$(inputs_hash deploy/images/prometheus/Containerfile deploy/images/prometheus/prometheus.yml)" \
  "$here/prometheus" -f "$here/prometheus/Containerfile"

kafka_hash="$(inputs_hash deploy/images/kafka/Containerfile deploy/images/kafka/pom.xml deploy/images/kafka/log4j2.properties deploy/images/kafka/bin/*)"
if ((force == 1)) || [[ "$(current_hash "$kafka_image")" != "$kafka_hash" ]]; then
  context="$(mktemp -d /var/tmp/strata-kafka.XXXXXX)"
  cp -r "$here/kafka/Containerfile" "$here/kafka/bin" "$here/kafka/log4j2.properties" "$context/"
  log "kafka jars from Maven Central"
  mvn -q -B -f "$here/kafka/pom.xml" dependency:copy-dependencies -DoutputDirectory="$context/libs" \
    -DincludeScope=runtime
  build "$kafka_image" "$kafka_hash" "$context" -f "$context/Containerfile"
  rm -rf "$context"
else
  log "$kafka_image: up to date ($kafka_hash)"
fi

if ((infra_only == 1)); then
  log "images ready: $kafka_image $redis_image"
  exit 0
fi

# Strata: the project's own Dockerfile, with the Debian-made Python as its base.
# Every file the Dockerfile copies, committed or not (what git does not ignore), by content.
strata_hash="$(cd "$root" && git ls-files -co --exclude-standard -- Dockerfile .dockerignore pyproject.toml \
  README.md protos strata strata_tools 'svc_*' | sort | xargs sha256sum | sha256sum | cut -c1-16)"
deps_hash="$(inputs_hash pyproject.toml)"
build "$strata_image" "$strata_hash" "$root" -f "$root/Dockerfile" --build-arg "BASE_IMAGE=$python_image" \
  --build-arg "STRATA_SOURCE_HASH=$strata_hash" --build-arg "STRATA_DEPS_HASH=$deps_hash" \
  "${ca_mount[@]}"
log "images ready: $strata_image $kafka_image $redis_image $prometheus_image"
