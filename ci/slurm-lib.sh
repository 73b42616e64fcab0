# Shared by ci/slurm-up.sh (the one-node Slurm) and ci/cluster-up.sh (the multi-node
# test cluster): Debian's Slurm and munge installed, and munged running. One munged
# serves both Slurms (its key and socket are this machine's). Sourced, never run.

slurm_log() { printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2; }

# slurm-wlm and munge, installed where a command of theirs is missing.
slurm_install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null && command -v sbatch >/dev/null; then
        return 0
    fi
    slurm_log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null; then
        # The package lists may be missing or stale on a fresh machine.
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
    fi
}

# munge: a key, its directories, and the daemon (started unless one answers).
munge_up() {
    install -d -m 0700 -o munge -g munge /etc/munge /var/lib/munge
    install -d -m 0755 -o munge -g munge /run/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        slurm_log "creating the munge key"
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if ! munge -n </dev/null >/dev/null 2>&1; then
        slurm_log "starting munged"
        # munged refuses to start as root; run it as its own user.
        runuser -u munge -- /usr/sbin/munged
        for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
        munge -n </dev/null >/dev/null
    fi
}
