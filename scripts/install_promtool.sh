#!/usr/bin/env bash
# Put promtool (Prometheus' rule checker and rule unit-test runner) and prometheus
# (the integration test's server, on loopback) in .tools/bin.
#
#   scripts/install_promtool.sh BINDIR
#
# promtool is not on PyPI, so it comes the way scripts/image.sh gets a container
# engine: one already on PATH is linked; otherwise, as root on Debian/Ubuntu,
# Debian's prometheus package (which ships promtool and prometheus) is
# installed with apt-get; anywhere else this says what to install and exits 0,
# and the tests that need it (tests/monitoring) skip with the same message.
set -euo pipefail
bindir=${1:?usage: install_promtool.sh BINDIR}
log() { echo "promtool: $*" >&2; }

if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "not installed: installing Debian's prometheus package with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            prometheus >/dev/null
    else
        log "SKIPPED: not installed and cannot be (needs root and apt-get); install" \
            "prometheus/promtool 2.x and put promtool on PATH, or tests/monitoring skips"
        exit 0
    fi
fi
mkdir -p "$bindir"
ln -sf "$(command -v promtool)" "$bindir/promtool"
if command -v prometheus >/dev/null; then
    ln -sf "$(command -v prometheus)" "$bindir/prometheus"
fi
log "$("$bindir/promtool" --version 2>&1 | head -1)"
