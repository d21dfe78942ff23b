#!/usr/bin/env bash
# Build the Dockerfile's scan image where no image registry can be reached, and run it: the base is a Debian
# bookworm root made here with debootstrap (from Debian's mirror) instead of nvidia/cuda, so what is checked is
# everything the Dockerfile does itself (the wheel built once, the scan target's install, its user), then
# `sdcguard --version`, a CPU scan and the report inside the image. Daemonless: buildah (Debian's package), the vfs
# storage driver, chroot isolation; run as root.
#
#   scripts/image_check.sh              # about 4 minutes on a 2-core machine (debootstrap 40 s, the build 2-3 min)
#
# The certificate authorities of this machine are put into the stand-in base (for pip behind a TLS proxy); nothing
# of it reaches the Dockerfile. KUBECTL_VERSION is left empty (dl.k8s.io may be out of reach): no kubectl.
# Exit status: 0 the image built and scanned; 1 a step failed (its output says which); 2 a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null || { echo "image_check: $tool is missing (apt-get install -y $tool)" >&2; exit 2; }
done
store=(--storage-driver vfs)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { echo "==> image_check: $*" >&2; }

step "a Debian bookworm root for the stand-in base (debootstrap --variant=minbase)"
debootstrap --variant=minbase bookworm "$work/root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -5 "$work/debootstrap.log"; exit 1; }
cp /etc/ssl/certs/ca-certificates.crt "$work/root/etc/pip-ca.crt"
printf '[global]\ncert = /etc/pip-ca.crt\n' >"$work/root/etc/pip.conf"
base=$(buildah "${store[@]}" from scratch)
cp -a "$work/root/." "$(buildah "${store[@]}" mount "$base")/"
buildah "${store[@]}" commit -q "$base" localhost/sdcguard-stand-in-base >/dev/null
buildah "${store[@]}" rm "$base" >/dev/null

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
step "the scan target as sdcguard-fleet:$version"
buildah "${store[@]}" bud --isolation chroot --layers=false --target scan \
    --build-arg CUDA_BASE=localhost/sdcguard-stand-in-base --build-arg KUBECTL_VERSION= \
    -t "sdcguard-fleet:$version" .

step "inside the image: sdcguard --version, a scan of one CPU core, the report"
ctr=$(buildah "${store[@]}" from "sdcguard-fleet:$version")
run() { buildah "${store[@]}" run --isolation chroot "$ctr" -- "$@"; }
run sdcguard --version
run sdcguard scan --all --budget 3s --device cpu:0
run sdcguard report --format json
buildah "${store[@]}" rm "$ctr" >/dev/null
step "passed: the image builds, runs as user $(buildah "${store[@]}" inspect --format '{{.OCIv1.Config.User}}' \
    "sdcguard-fleet:$version"), scans and reports"
