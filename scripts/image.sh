#!/usr/bin/env bash
# Build the metagpu image with whatever container engine this machine has.
#
#   scripts/image.sh engine          print the engine that would be used
#   scripts/image.sh build           build $IMAGE from the Dockerfile
#   scripts/image.sh archive [FILE]  build, then write it as an OCI archive
#
# Settings (environment; the Makefile passes its variables through):
#   ENGINE      docker | podman | buildah; default: the first that works, in that
#               order (Docker only when its daemon answers). With none, and as
#               root on Debian/Ubuntu, podman, buildah, runc and mmdebstrap are
#               installed with apt-get; anywhere else the script says what to install.
#   IMAGE       the tag to build (default ghcr.io/metagpu/metagpu:dev, the chart's
#               repository, so a loaded archive needs only --set image.tag=dev)
#   IMAGE_BASE  local (default): a Debian Python base made here from Debian's
#               packages (scripts/image_base.sh, cached); official: the
#               Dockerfile's default (python:3.11.x-slim from Docker Hub); or
#               any other image reference, passed as PYTHON_IMAGE.
#   BUILD_CA_BUNDLE  CA bundle pip trusts in the build (a build secret, never
#               in a layer); default: the host's, when it has one. Needed
#               behind TLS-intercepting proxies, harmless elsewhere.
#   STORAGE_DRIVER   podman/buildah storage: default overlay where the kernel
#               mounts it, vfs otherwise (or whatever an existing store uses).
set -euo pipefail

IMAGE=${IMAGE:-ghcr.io/metagpu/metagpu:dev}
IMAGE_BASE=${IMAGE_BASE:-local}
LOCAL_BASE_TAG=${LOCAL_BASE_TAG:-localhost/metagpu-python-base:3.11-bookworm}
ARCHIVE_DEFAULT=build/metagpu-image.oci.tar
here=$(cd "$(dirname "$0")" && pwd)

log() { echo "image: $*" >&2; }

docker_works() { command -v docker >/dev/null && docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install_engine() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        return 1
    fi
    log "no container engine: installing podman, buildah, runc and mmdebstrap with apt-get"
    # runc beside podman's default crun: crun refuses hosts with a hybrid cgroup
    # layout (v1 controllers and a non-empty v2 hierarchy), which these machines have.
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        podman buildah runc mmdebstrap ca-certificates >/dev/null
}

pick_engine() {
    if [ -n "${ENGINE:-}" ]; then
        command -v "$ENGINE" >/dev/null || { log "ENGINE=$ENGINE is not installed"; return 1; }
        echo "$ENGINE"
        return 0
    fi
    if docker_works; then echo docker; return 0; fi
    for candidate in podman buildah; do
        if command -v "$candidate" >/dev/null; then echo "$candidate"; return 0; fi
    done
    return 1
}

# The storage driver for podman/buildah as root. An existing store keeps its
# driver (containers/storage refuses to switch); a new one gets overlay when the
# kernel mounts it here (copy-on-write: layers and containers cost no copies),
# else vfs (works everywhere, copies every layer in full).
storage_driver() {
    if [ -n "${STORAGE_DRIVER:-}" ] || [ "$(id -u)" != 0 ]; then return 0; fi
    local root=/var/lib/containers/storage
    for driver in overlay vfs; do
        if [ -d "$root/$driver-layers" ]; then export STORAGE_DRIVER=$driver; return 0; fi
    done
    local probe
    probe=$(mktemp -d)
    mkdir -p "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
    if mount -t overlay overlay \
        -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
        umount "$probe/merged"
        export STORAGE_DRIVER=overlay
    else
        export STORAGE_DRIVER=vfs
    fi
    rm -rf "$probe"
}

ensure_engine() {
    local engine
    if ! engine=$(pick_engine); then
        if [ -z "${ENGINE:-}" ] && install_engine; then
            engine=$(pick_engine)
        else
            log "no container engine (docker with a running daemon, podman or buildah)"
            log "and none can be installed here (needs root and apt-get): install one"
            return 1
        fi
    fi
    echo "$engine"
}

build() {
    local engine=$1 base_args=() secret_args=()
    case $engine in podman | buildah) storage_driver ;; esac
    # RUN steps in a chroot: no nested namespaces or OCI runtime needed to build.
    export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
    case $IMAGE_BASE in
        official) ;;
        local)
            if ! command -v mmdebstrap >/dev/null; then
                if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
                    log "installing mmdebstrap (makes the local base)"
                    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null
                else
                    log "IMAGE_BASE=local needs mmdebstrap; or pass IMAGE_BASE=official"
                    return 1
                fi
            fi
            "$here/image_base.sh" "$engine" "$LOCAL_BASE_TAG"
            base_args=(--build-arg "PYTHON_IMAGE=$LOCAL_BASE_TAG")
            ;;
        *) base_args=(--build-arg "PYTHON_IMAGE=$IMAGE_BASE") ;;
    esac
    local ca=${BUILD_CA_BUNDLE-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
    if [ -n "$ca" ] && [ -s "$ca" ]; then
        secret_args=(--secret "id=pip-ca,src=$ca")
    fi
    local revision
    revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    local args=(-t "$IMAGE" --build-arg "REVISION=$revision" "${base_args[@]}" "${secret_args[@]}")
    log "building $IMAGE with $engine (base: $IMAGE_BASE${STORAGE_DRIVER:+, storage $STORAGE_DRIVER})"
    case $engine in
        docker) DOCKER_BUILDKIT=1 docker build "${args[@]}" . ;;
        podman) podman build --layers "${args[@]}" . ;;
        buildah) buildah build --layers "${args[@]}" . ;;
    esac
}

archive() {
    local engine=$1 out=$2
    mkdir -p "$(dirname "$out")"
    rm -f "$out"
    case $engine in
        # Docker's `save` writes an OCI image layout too (Docker 25+), which is
        # what ctr, kind and skopeo read.
        docker) docker save -o "$out" "$IMAGE" ;;
        podman) podman save --format oci-archive -o "$out" "$IMAGE" ;;
        buildah) buildah push --quiet "$IMAGE" "oci-archive:$out:$IMAGE" ;;
    esac
    log "wrote $out ($(du -h "$out" | cut -f1)) holding $IMAGE"
}

command=${1:-build}
case $command in
    engine)
        engine=$(ensure_engine)
        case $engine in podman | buildah) storage_driver ;; esac
        echo "$engine${STORAGE_DRIVER:+ $STORAGE_DRIVER}"
        ;;
    build)
        engine=$(ensure_engine)
        build "$engine"
        ;;
    archive)
        engine=$(ensure_engine)
        build "$engine"
        archive "$engine" "${2:-$ARCHIVE_DEFAULT}"
        ;;
    *)
        echo "usage: $0 engine|build|archive [FILE]" >&2
        exit 2
        ;;
esac
