#!/usr/bin/env bash
# Build pmc.sif, the image clusters run (`apptainer exec pmc.sif pmc run ...`), from the
# OCI runtime image of the Containerfile, without an apptainer binary:
#
#   bash ci/build-sif.sh [IMAGE [OUT]]     (default localhost/pmc:latest, ./pmc.sif; root)
#
# The file is laid out as `apptainer build pmc.sif docker-daemon:IMAGE` writes it: a SIF
# container (written with Debian's siftool, the SIF format's reference tool) holding
#   1 Def.FILE      the definition: where the image came from, and apptainer.def's
#                   %environment, %runscript, %test, %labels and %help
#   2 JSON.Generic  the labels (Apptainer's labels.json)
#   3 FS            the root file system, a squashfs partition: the primary system
#                   partition (Squashfs/*System/amd64) that `apptainer exec` mounts
# and the launch line `#!/usr/bin/env run-singularity`, so `./pmc.sif run w.dag` works
# where Apptainer is installed. The root file system is the image's, plus /.singularity.d
# as Apptainer makes it from an OCI image: env/10-docker2singularity.sh (the image's ENV),
# env/90-environment.sh (%environment), runscript, test, labels.json, runscript.help, the
# definition, and the actions (exec, run, shell, test) that source env/*.sh first.
#
# Without the image, it is built first (`bash ci/container-test.sh --runtime-only`).
# Needs podman, mksquashfs (squashfs-tools) and siftool; installs the last two with apt
# when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${1:-localhost/pmc:latest}
OUT=${2:-pmc.sif}
START=$SECONDS
step() { printf '==> [build-sif %4ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() { printf '==> [build-sif %4ds] FAILED: %s\n' "$((SECONDS - START))" "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (podman image mount)"
need=()
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v siftool >/dev/null || need+=(siftool)
if [ "${#need[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || fail "missing ${need[*]} and no apt-get to install them"
    step "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v podman >/dev/null || fail "needs podman"

if ! podman image exists "$IMAGE"; then
    [ "$IMAGE" = localhost/pmc:latest ] || fail "no image $IMAGE"
    step "no $IMAGE: building it"
    bash ci/container-test.sh --runtime-only || fail "building $IMAGE"
fi

WORK=$(mktemp -d /tmp/pmc-sif.XXXXXX)
cleanup() { podman image umount "$IMAGE" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
ROOT=$(podman image mount "$IMAGE")
step "image $IMAGE ($(podman image inspect --format '{{.Id}}' "$IMAGE" | cut -c1-12))"

# --- /.singularity.d ------------------------------------------------------------------
# apptainer.def's sections, as `apptainer build` puts them in the image.
section() { awk -v want="%$1" '/^%[a-z]+[[:space:]]*$/ { on = ($1 == want); next } on' apptainer.def \
    | sed 's/^    //'; }
SD=$WORK/sd
mkdir -p "$SD/env" "$SD/actions" "$SD/libs"
{
    echo '#!/bin/sh'
    echo '# The OCI image'"'"'s environment (ENV), as Apptainer writes it on conversion.'
    podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" \
        | while IFS= read -r kv; do
            [ -n "$kv" ] || continue
            name=${kv%%=*}
            printf 'export %s=%q\n' "$name" "${kv#*=}"
        done
} >"$SD/env/10-docker2singularity.sh"
{ echo '#!/bin/sh'; echo '# %environment'; section environment; } >"$SD/env/90-environment.sh"
{ echo '#!/bin/sh'; section runscript; } >"$SD/runscript"
{ echo '#!/bin/sh'; section test; } >"$SD/test"
section help >"$SD/runscript.help"
for action in exec run shell test; do
    case $action in
        exec) last='exec "$@"' ;;
        run) last='exec /.singularity.d/runscript "$@"' ;;
        shell) last='exec /bin/sh "$@"' ;;
        test) last='exec /.singularity.d/test "$@"' ;;
    esac
    printf '#!/bin/sh\nfor script in /.singularity.d/env/*.sh; do\n    if [ -f "$script" ]; then . "$script"; fi\ndone\n%s\n' \
        "$last" >"$SD/actions/$action"
done
# Labels: the image's (the Containerfile's LABEL, which apptainer.def's %labels repeat)
# and those Apptainer adds.
podman image inspect --format '{{json .Labels}}' "$IMAGE" | python3 -c '
import json, sys, time
labels = json.load(sys.stdin) or {}
labels.update({
    "org.label-schema.schema-version": "1.0",
    "org.label-schema.build-arch": "amd64",
    "org.label-schema.build-date": time.strftime("%A_%d_%B_%Y_%H:%M:%S_%Z"),
    "org.label-schema.usage.singularity.deffile.bootstrap": "docker-daemon",
    "org.label-schema.usage.singularity.deffile.from": sys.argv[1],
    "org.label-schema.usage.apptainer.runscript.help": "/.singularity.d/runscript.help",
})
json.dump(labels, sys.stdout, indent=4, sort_keys=True)
' "$IMAGE" >"$SD/labels.json"
{
    echo "Bootstrap: docker-daemon"
    echo "From: $IMAGE"
    echo
    echo "# Built by ci/build-sif.sh from the OCI image of the Containerfile, which installs"
    echo "# what apptainer.def does; the sections below are apptainer.def's."
    for s in environment runscript test labels help; do
        echo "%$s"
        section "$s" | sed 's/^/    /'
        echo
    done
} >"$SD/Singularity"
chmod 755 "$SD/env/"*.sh "$SD/actions/"* "$SD/runscript" "$SD/test"

# --- the root file system --------------------------------------------------------------
step "root file system: the image, and /.singularity.d"
mkdir "$WORK/rootfs"
cp -a "$ROOT/." "$WORK/rootfs/"
rm -rf "$WORK/rootfs/.singularity.d"
cp -a "$SD" "$WORK/rootfs/.singularity.d"
ln -sfn .singularity.d/runscript "$WORK/rootfs/singularity"
ln -sfn .singularity.d/env/90-environment.sh "$WORK/rootfs/environment"
podman image umount "$IMAGE" >/dev/null

t0=$SECONDS
mksquashfs "$WORK/rootfs" "$WORK/rootfs.squashfs" -noappend -comp gzip -quiet >/dev/null \
    || fail "mksquashfs"
step "squashfs: $(du -m "$WORK/rootfs.squashfs" | cut -f1) MB in $((SECONDS - t0))s"
rm -rf "$WORK/rootfs"

# --- the SIF file ----------------------------------------------------------------------
TMP=$OUT.tmp.$$
rm -f "$TMP"
siftool new "$TMP"
siftool add "$TMP" "$SD/Singularity" --datatype 1 --groupid 1 --filename Singularity
siftool add "$TMP" "$SD/labels.json" --datatype 6 --groupid 1 --filename labels.json
# Partition type 2 is the primary system partition (siftool's numbering: 1 System,
# 2 PrimSys), file system 1 squashfs, architecture 2 amd64.
siftool add "$TMP" "$WORK/rootfs.squashfs" --datatype 4 --parttype 2 --partfs 1 \
    --partarch 2 --groupid 1 --filename rootfs.squashfs
# The launch line Apptainer writes into the header's first 32 bytes.
printf '#!/usr/bin/env run-singularity\n' | dd of="$TMP" conv=notrunc status=none
chmod 755 "$TMP"
mv -f "$TMP" "$OUT"
siftool list "$OUT"
siftool list "$OUT" | grep -q 'FS (Squashfs/\*System/amd64)' \
    || fail "$OUT has no primary system squashfs partition"
step "$OUT: $(du -m "$OUT" | cut -f1) MB, done in $((SECONDS - START))s"
