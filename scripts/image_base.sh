#!/usr/bin/env bash
# Make a local Debian Python base image for the Dockerfile (PYTHON_IMAGE), for
# machines that cannot pull python:3.11.x-slim from a registry.
#
#   scripts/image_base.sh ENGINE TAG
#
# The root filesystem comes from Debian's own packages (mmdebstrap, minbase
# variant): python3 (3.11 on bookworm, the official image's minor version, so
# the same cp311 wheels install), python3-venv (the Dockerfile builds a virtual
# environment, which also keeps it clear of Debian's EXTERNALLY-MANAGED marker)
# and ca-certificates (pip's downloads in the build stage). Documentation, man
# pages and translations are left out, as in the official slim image.
#
# Cached twice, keyed by a hash of this script (what the root filesystem is made
# of): the tarball under $IMAGE_CACHE (default .tools/image, ignored by git), and
# the imported image in the engine's storage, labelled with the key. A second run
# with an unchanged script does nothing.
set -euo pipefail

engine=${1:?usage: image_base.sh ENGINE TAG}
tag=${2:?usage: image_base.sh ENGINE TAG}
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${IMAGE_CACHE:-.tools/image}

key=$( { cat "$0"; echo "$suite $mirror"; } | sha256sum | cut -c1-16)
label=io.metagpu.base.key

existing_key() {
    case $engine in
        docker) docker image inspect --format "{{ index .Config.Labels \"$label\" }}" "$tag" ;;
        podman) podman image inspect --format "{{ index .Labels \"$label\" }}" "$tag" ;;
        buildah) buildah inspect --type image --format "{{ index .OCIv1.Config.Labels \"$label\" }}" "$tag" ;;
    esac 2>/dev/null || true
}

if [ "$(existing_key)" = "$key" ]; then
    echo "image_base: $tag is up to date (key $key)"
    exit 0
fi

tarball=$cache/python-base-$suite-$key.tar
if [ ! -s "$tarball" ]; then
    command -v mmdebstrap >/dev/null || {
        echo "image_base: mmdebstrap is missing (apt-get install mmdebstrap)" >&2
        exit 1
    }
    mkdir -p "$cache"
    rm -f "$cache"/python-base-"$suite"-*.tar
    echo "image_base: making the $suite root filesystem (mmdebstrap, about a minute)"
    # merged-usr hook: /bin -> usr/bin etc. without the usrmerge package (which
    # would pull in perl). The path excludes are the official slim image's.
    mmdebstrap --variant=minbase --mode=root --format=tar \
        --include=python3,python3-venv,ca-certificates \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/lintian/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
        "$suite" "$tarball.partial" "$mirror"
    mv "$tarball.partial" "$tarball"
fi

# The official image's environment, so the Dockerfile sees the same one.
env_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "image_base: importing $tarball as $tag"
case $engine in
    docker | podman)
        "$engine" import \
            --change "ENV PATH=$env_path" --change 'ENV LANG=C.UTF-8' \
            --change "LABEL $label=$key" --change 'CMD ["python3"]' \
            "$tarball" "$tag" >/dev/null
        ;;
    buildah)
        ctr=$(buildah from scratch)
        trap 'buildah rm "$ctr" >/dev/null' EXIT
        buildah add --quiet "$ctr" "$tarball" / >/dev/null
        buildah config --env PATH=$env_path --env LANG=C.UTF-8 \
            --label "$label=$key" --cmd python3 "$ctr"
        buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
        trap - EXIT
        ;;
    *)
        echo "image_base: unknown engine $engine" >&2
        exit 1
        ;;
esac
echo "image_base: $tag ready (key $key)"
