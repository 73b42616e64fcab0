#!/usr/bin/env bash
# The two MPI models of docs/containers.md, run on the built runtime image without
# Apptainer. Each rank enters the image's root file system the way `apptainer exec` does
# (a private mount namespace; /dev, /proc, /sys and a work directory bound in; chroot),
# and a launcher on the host starts the ranks:
#
#   hybrid   the image's own MPICH, wired up through the host launcher's PMI
#   bind     the host's libmpi (MPICH ABI) bound in at /mnt and chosen with MPI4PY_LIBMPI
#   openmpi  the host's Open MPI (libmpi.so.40, its plugins and the libraries they need
#            that the image lacks, gathered into one directory as a site's
#            /opt/openmpi holds them) bound in at /mnt, the ranks started by the host's
#            Open MPI launcher (mpiexec.openmpi); only where Open MPI is installed
#
# Launchers: the host's mpiexec (Hydra), and `srun --mpi=pmi2` when PMC_TEST_SLURM=1
# (the one-node Slurm of ci/slurm-up.sh is up), for hybrid and bind; mpiexec.openmpi for
# openmpi.
#
#   bash ci/container-mpi-models.sh [IMAGE]        (default localhost/pmc:latest; root)
#
# Environment: PMC_HOST_MPI_LIBDIR, the host directory holding libmpi.so.12 for the bind
# model (default: lib/ beside the bin/ of the host's mpiexec).
set -euo pipefail

IMAGE=${1:-localhost/pmc:latest}
START=$SECONDS
step() { printf '==> [mpi-models %4ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() { printf '==> [mpi-models %4ds] FAILED: %s\n' "$((SECONDS - START))" "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (mount namespaces and chroot)"
for tool in podman unshare chroot; do
    command -v "$tool" >/dev/null || fail "needs $tool"
done
HOST_MPIEXEC=$(command -v mpiexec || true)
[ -n "$HOST_MPIEXEC" ] || fail "needs the host's mpiexec (pip install 'pmc[mpi]')"
HOST_LIBDIR=${PMC_HOST_MPI_LIBDIR:-$(dirname "$(dirname "$(readlink -f "$HOST_MPIEXEC")")")/lib}
# pyenv puts a shim on PATH; ask the interpreter where its prefix is instead.
if [ ! -e "$HOST_LIBDIR/libmpi.so.12" ] && command -v python3 >/dev/null; then
    HOST_LIBDIR=$(python3 -c 'import sys; print(sys.prefix + "/lib")')
fi
[ -e "$HOST_LIBDIR/libmpi.so.12" ] || fail "no libmpi.so.12 in $HOST_LIBDIR (set PMC_HOST_MPI_LIBDIR)"

ROOT=$(podman image mount "$IMAGE")
WORK=$(mktemp -d /tmp/pmc-mpi-models.XXXXXX)
cleanup() { podman image umount "$IMAGE" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
for d in dev proc sys tmp mnt; do
    [ -d "$ROOT/$d" ] || fail "the image has no /$d to bind onto"
done

cat >"$WORK/diamond.dag" <<'EOF'
TASK A /bin/echo a
TASK B /bin/echo b
TASK C /bin/echo c
TASK D /bin/echo d
EDGE A B
EDGE A C
EDGE B D
EDGE C D
EOF
# The host's Open MPI, for the openmpi model: what `apptainer exec --bind /opt/openmpi`
# would bring in. Debian spreads it over /usr/lib; a site's prefix holds it in one place.
gather_openmpi() {
    local dest=$1 pkglib libmpi pmix name path f
    pkglib=$(ompi_info --path pkglibdir | awk '{print $2}')
    libmpi=$(readlink -f "$(ompi_info --path libdir | awk '{print $2}')/libmpi.so")
    pmix=$(ldd "$pkglib"/mca_pmix_*.so | awk '$1 == "libpmix.so.2" {print $3; exit}')
    [ -n "$pmix" ] || fail "Open MPI's PMIx library not found (ldd $pkglib/mca_pmix_*.so)"
    mkdir -p "$dest/lib/openmpi" "$dest/lib/pmix"
    cp -a "$pkglib"/. "$dest/lib/openmpi/"
    cp -a "$(dirname "$(readlink -f "$pmix")")/pmix"/. "$dest/lib/pmix/"
    cp -L "$libmpi" "$dest/lib/libmpi.so.40"
    # The libraries these link to that the image does not have.
    for f in "$dest/lib/libmpi.so.40" "$dest"/lib/openmpi/*.so "$dest"/lib/pmix/*.so; do
        ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
    done | sort -u | while read -r name path; do
        [ -e "$dest/lib/$name" ] || [ -e "$ROOT/usr/lib/x86_64-linux-gnu/$name" ] \
            || [ -e "$ROOT/lib/x86_64-linux-gnu/$name" ] || cp -L "$path" "$dest/lib/$name"
    done
}

# Which libmpi each rank loaded, and whether the ranks form one world.
cat >"$WORK/probe.py" <<'EOF'
from mpi4py import MPI

comm = MPI.COMM_WORLD
with open("/proc/self/maps") as maps:
    libs = sorted({line.split()[-1] for line in maps if "/libmpi" in line})
# A file per rank: the launcher's stdout forwarding may interleave lines.
with open(f"probe.{comm.Get_rank()}", "w") as out:
    out.write(f"probe rank={comm.Get_rank()} size={comm.Get_size()} lib={','.join(libs)}\n")
EOF
# One rank: what `apptainer exec [--bind HOST_LIBDIR:/mnt] IMAGE CMD...` does for it.
# Launcher variables (PMI_*, SLURM_*) and the PMI socket pass through unchanged.
cat >"$WORK/rank.sh" <<'EOF'
#!/bin/sh
set -e
exec unshare --mount --propagation private sh -c '
    set -e
    mount --rbind /dev "$PMC_ROOT/dev"
    mount -t proc proc "$PMC_ROOT/proc"
    mount --rbind /sys "$PMC_ROOT/sys"
    mount --bind "$PMC_WORK" "$PMC_ROOT/tmp"
    mount --bind "$PMC_HOST_LIBDIR" "$PMC_ROOT/mnt"
    cd "$PMC_ROOT/tmp"
    exec chroot "$PMC_ROOT" /usr/bin/env PATH=/opt/pmc/bin:/usr/bin:/bin \
        sh -c "cd /tmp && exec \"\$@\"" rank "$@"
' rank "$@"
EOF
chmod +x "$WORK/rank.sh"
export PMC_ROOT=$ROOT PMC_WORK=$WORK PMC_HOST_LIBDIR=$HOST_LIBDIR

launchers=("mpiexec -n 3")
if [ "${PMC_TEST_SLURM:-}" = 1 ] && command -v srun >/dev/null; then
    launchers+=("srun --mpi=pmi2 -n 3")
fi

# run MODEL LAUNCHER: a probe launch, then the DAG in a second launch.
run() {
    local model=$1 launcher=$2 env=() want out
    if [ "$model" = bind ]; then
        env=(env MPI4PY_LIBMPI=/mnt/libmpi.so.12)
        want="lib=/mnt/libmpi.so.12"
    elif [ "$model" = openmpi ]; then
        # Open MPI finds its plugins (and PMIx its own) by the paths it was built with:
        # point both at /mnt. PMIx's shared-memory store is a file in the launcher's
        # session directory under the host's /tmp, which the ranks here do not see
        # (their /tmp is the work directory; Apptainer binds the host's): its hash
        # store instead.
        env=(env MPI4PY_LIBMPI=/mnt/lib/libmpi.so.40 LD_LIBRARY_PATH=/mnt/lib
             OMPI_MCA_mca_base_component_path=/mnt/lib/openmpi
             PMIX_MCA_mca_base_component_path=/mnt/lib/pmix PMIX_MCA_gds=hash)
        want="lib=/mnt/lib/libmpi.so.40"
    else
        env=(env -u MPI4PY_LIBMPI)
        want="lib=/opt/pmc/lib/libmpi.so.12"
    fi
    step "$model model, $launcher: probe"
    rm -f "$WORK"/probe.?
    # shellcheck disable=SC2086  # the launcher is a command line
    out=$(cd "$WORK" && timeout 120 $launcher "$WORK/rank.sh" "${env[@]}" python probe.py 2>&1) \
        || { echo "$out" >&2; fail "$model/$launcher: probe"; }
    out=$(cat "$WORK"/probe.? 2>/dev/null || true)
    echo "$out"
    [ "$(echo "$out" | grep -c "^probe rank=[0-2] size=3 $want\$")" = 3 ] \
        || fail "$model/$launcher: expected 3 ranks of one world with $want"
    # With every rank on one host under Hydra pmc starts no MPI at all (the store's word
    # through the same PMI socket): run it that way and with MPI asked for, which goes
    # through the model's libmpi.
    local always
    for always in 1 ""; do
        step "$model model, $launcher: pmc run diamond.dag (PMC_ALWAYS_MPI=$always)"
        rm -f "$WORK"/diamond.dag.*
        # shellcheck disable=SC2086
        out=$(cd "$WORK" && timeout 120 $launcher "$WORK/rank.sh" "${env[@]}" \
            PMC_ALWAYS_MPI="$always" pmc run diamond.dag 2>&1) \
            || { echo "$out" >&2; fail "$model/$launcher: pmc run"; }
        echo "$out" | grep 'cluster-summary' \
            | grep -q 'stat="ok", tasks=4, submitted=4, succeeded=4, failed=0' \
            || { echo "$out" >&2; fail "$model/$launcher: the DAG did not succeed"; }
        echo "$out" | grep -q 'app="/opt/pmc/bin/pmc"' \
            || { echo "$out" >&2; fail "$model/$launcher: pmc did not run from the image"; }
    done
}

step "image $IMAGE; host MPI for the bind model: $HOST_LIBDIR"
for launcher in "${launchers[@]}"; do
    run hybrid "$launcher"
    run bind "$launcher"
done
models="both MPI models passed with: ${launchers[*]}"
if command -v mpiexec.openmpi >/dev/null && command -v ompi_info >/dev/null; then
    gather_openmpi "$WORK/openmpi"
    step "the host's $(ompi_info --version | head -n 1), gathered into $WORK/openmpi"
    # As root, Open MPI wants to be told twice; three ranks on fewer cores need
    # --oversubscribe.
    ompi="env PMC_HOST_LIBDIR=$WORK/openmpi OMPI_ALLOW_RUN_AS_ROOT=1"
    ompi+=" OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpiexec.openmpi -n 3 --oversubscribe --bind-to none"
    run openmpi "$ompi"
    models+="; the bind model with the host's Open MPI under mpiexec.openmpi"
else
    step "no Open MPI on the host (mpiexec.openmpi, ompi_info): its bind model not run"
fi
step "$models"
