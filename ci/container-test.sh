#!/usr/bin/env bash
# Container regression: build the Containerfile with podman and run its `test` stage,
# which runs the test suite inside the image against the installed wheel; then run the
# image under the host's MPI launcher in both MPI models (ci/container-mpi-models.sh).
#
#   bash ci/container-test.sh                 (all of it)
#   bash ci/container-test.sh --runtime-only  (only the runtime image: ci/build-sif.sh)
#
# After the MPI models it builds pmc.sif from the runtime image (ci/build-sif.sh) and runs
# tests/test_sif.py on that file: pmc from inside the SIF, in both MPI models.
#
# Environment:
#   PMC_CONTAINER_BASE   base image to build on (default: a Debian bookworm image made
#                        here with debootstrap and imported as localhost/debian:bookworm,
#                        since CI reaches no container registry). Reused when present.
#   PMC_CONTAINER_MIRROR Debian mirror for debootstrap (default: the one apt uses here).
#   PMC_CONTAINER_TAG    image name (default: localhost/pmc); tags :latest and :test.
#
# podman runs here as root with --isolation=chroot; `podman run` is not needed (and does
# not work on every CI machine), because the tests run as a build stage.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME_ONLY=0
if [ "${1:-}" = --runtime-only ]; then RUNTIME_ONLY=1; fi

START=$SECONDS
step() { printf '==> [container-test %4ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() { printf '==> [container-test %4ds] FAILED: %s\n' "$((SECONDS - START))" "$*" >&2; exit 1; }

LOCAL_BASE=localhost/debian:bookworm
BASE=${PMC_CONTAINER_BASE:-$LOCAL_BASE}
TAG=${PMC_CONTAINER_TAG:-localhost/pmc}

WORK=$(mktemp -d /tmp/pmc-container.XXXXXX)
# --one-file-system: a failed debootstrap can leave /proc or /sys mounted in its root.
cleanup() { rm -rf --one-file-system "$WORK"; }
trap cleanup EXIT

# --- tools -----------------------------------------------------------------------------
need=()
command -v podman >/dev/null || need+=(podman)
if [ "$BASE" = "$LOCAL_BASE" ] && ! command -v debootstrap >/dev/null; then
    need+=(debootstrap)
fi
if [ "${#need[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || fail "missing ${need[*]} and no apt-get to install them"
    step "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
step "$(podman --version)"

# --- base image ------------------------------------------------------------------------
debian_mirror() {
    # The mirror apt already uses for bookworm (deb822 .sources or one-line .list).
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
            /^[[:space:]]*$/ { if (uri != "" && suites ~ /(^| )bookworm( |$)/) { print uri; uri = ""; exit }
                               uri = ""; suites = ""; next }
            tolower($1) == "uris:"   { uri = $2 }
            tolower($1) == "suites:" { $1 = ""; suites = $0 " " }
            END { if (uri != "" && suites ~ /(^| )bookworm( |$)/) print uri }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                           if ($(i + 1) == "bookworm") print $i }' "$f"
    done
}

if podman image exists "$BASE"; then
    step "base image $BASE: present, reused"
elif [ "$BASE" = "$LOCAL_BASE" ]; then
    MIRROR=${PMC_CONTAINER_MIRROR:-$(debian_mirror | head -n 1)}
    [ -n "$MIRROR" ] || fail "no Debian bookworm mirror in /etc/apt; set PMC_CONTAINER_MIRROR"
    step "base image $BASE: debootstrap --variant=minbase bookworm from $MIRROR"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -n 30 "$WORK/debootstrap.log" >&2; fail "debootstrap"; }
    tar -C "$WORK/rootfs" -c . | podman import - "$LOCAL_BASE" >/dev/null
    rm -rf --one-file-system "$WORK/rootfs"
    step "base image $BASE: imported"
else
    step "base image $BASE: not present locally, podman will pull it"
fi

# --- pip configuration for the build ---------------------------------------------------
# pip inside the build reaches the package index the way pip on this host does: the
# host's index settings (minus local paths, which the build cannot see) go into a
# pip.conf, and the host's CA bundle beside it; the directory is mounted into every RUN
# step and named by the PIP_CONFIG_FILE build argument. Only the empty mount point
# stays in the image; the settings and the bundle do not.
CA=/etc/ssl/certs/ca-certificates.crt
IN_BUILD=/run/pmc-build
mkdir -p "$WORK/pip"
host_pip_config() {
    command -v python3 >/dev/null || return 0
    python3 -m pip config list 2>/dev/null | python3 -c '
import sys

keep = {"index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout",
        "retries", "proxy"}
seen = {}
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    name = key.rpartition(".")[2]
    if name not in keep:
        continue
    value = value.strip().strip("\x27\"")
    # Local directories and file:// indexes exist only on the host.
    words = [w for w in value.split() if not w.startswith(("/", "file:"))]
    if words:
        seen[name] = " ".join(words)
for name, value in seen.items():
    print(f"{name} = {value}")
'
}
{
    echo "[global]"
    host_pip_config
    if [ -f "$CA" ]; then
        cp "$CA" "$WORK/pip/ca-certificates.crt"
        echo "cert = $IN_BUILD/ca-certificates.crt"
    fi
} >"$WORK/pip/pip.conf"
step "pip configuration for the build: $(grep -c = "$WORK/pip/pip.conf") setting(s)"

# --- build -----------------------------------------------------------------------------
BUILD=(podman build --isolation=chroot --layers -f Containerfile --build-arg "BASE=$BASE"
       -v "$WORK/pip:$IN_BUILD:ro" --build-arg "PIP_CONFIG_FILE=$IN_BUILD/pip.conf")

step "building runtime image $TAG:latest"
t0=$SECONDS
"${BUILD[@]}" --target runtime -t "$TAG:latest" . || fail "runtime image build"
step "runtime image built in $((SECONDS - t0))s"
if [ "$RUNTIME_ONLY" = 1 ]; then
    step "done (--runtime-only) in $((SECONDS - START))s"
    exit 0
fi

step "building test stage (runs the test suite inside the image)"
t0=$SECONDS
"${BUILD[@]}" --target test --build-arg "TEST_RUN=$(date +%s)" -t "$TAG:test" . \
    || fail "test stage: the test suite failed inside the image (see above)"
step "test stage passed in $((SECONDS - t0))s"

# --- apptainer.def ---------------------------------------------------------------------
# Apptainer cannot be installed here, so podman runs the recipe's sections on the same
# base the way `apptainer build` would: %files copied, %post run, then %test run with
# %environment sourced (a smoke DAG in local mode and under the image's mpiexec).
section() { awk -v want="%$1" '/^%[a-z]+[[:space:]]*$/ { on = ($1 == want); next } on' apptainer.def; }
DEF=$WORK/def
mkdir -p "$DEF"
section post >"$DEF/post.sh"
section environment >"$DEF/environment.sh"
section test >"$DEF/test.sh"
[ -s "$DEF/post.sh" ] && [ -s "$DEF/test.sh" ] || fail "apptainer.def has no %post or %test"
# The scripts come in through a mount, so their digests go into the RUN lines: a changed
# section is never taken from the layer cache.
{
    echo 'ARG BASE'
    echo 'FROM ${BASE}'
    echo 'ARG PIP_CONFIG_FILE='
    section files | while read -r src dest; do
        if [ -n "$src" ]; then echo "COPY $src $dest"; fi
    done
    echo "RUN sh -e /run/pmc-def/post.sh # $(sha256sum <"$DEF/post.sh" | cut -c1-16)"
    echo 'ARG TEST_RUN=0'
    echo "RUN . /run/pmc-def/environment.sh && sh -e /run/pmc-def/test.sh" \
         "# $(cat "$DEF/environment.sh" "$DEF/test.sh" | sha256sum | cut -c1-16)"
} >"$DEF/Containerfile"
step "apptainer.def: %files, %post and %test on $BASE"
t0=$SECONDS
podman build --isolation=chroot --layers -f "$DEF/Containerfile" --build-arg "BASE=$BASE" \
    -v "$WORK/pip:$IN_BUILD:ro" --build-arg "PIP_CONFIG_FILE=$IN_BUILD/pip.conf" \
    -v "$DEF:/run/pmc-def:ro" --build-arg "TEST_RUN=$(date +%s)" -t "$TAG:apptainer-def" . \
    || fail "apptainer.def: %post or %test failed (see above)"
step "apptainer.def sections passed in $((SECONDS - t0))s"

# Both MPI models of docs/containers.md on the runtime image, launched from the host.
if command -v mpiexec >/dev/null; then
    step "MPI models (hybrid, bind) on $TAG:latest"
    bash ci/container-mpi-models.sh "$TAG:latest" || fail "MPI models on the runtime image"
else
    step "MPI models skipped: no mpiexec on this host (pip install '.[mpi]')"
fi

# pmc.sif from the runtime image, and pmc run from inside that file (tests/test_sif.py).
step "pmc.sif from $TAG:latest"
t0=$SECONDS
bash ci/build-sif.sh "$TAG:latest" pmc.sif || fail "building pmc.sif"
PMC_TEST_SIF=$PWD/pmc.sif python -m pytest -p no:cacheprovider -q tests/test_sif.py \
    || fail "tests/test_sif.py on pmc.sif"
step "pmc.sif built and tested in $((SECONDS - t0))s"

step "done in $((SECONDS - START))s"
