# shellcheck shell=bash
# Start a private Docker engine for dew-sandbox's ContainerRunner tests.
#
# SOURCE this file (``source tools/ci/container_engine.sh``); .ci/run does so before
# ``uv run nox``. On success it exports
#
#   DOCKER_HOST=unix:///run/dew-docker/docker.sock
#   DEW_SANDBOX_IMAGE=dew-sandbox-python:bookworm-stdlib
#
# and the nox sessions inherit both. When an engine cannot start it prints the reason
# and exports nothing, so the container tests skip and say why.
#
# What it does, each step skipped when already done (running it twice reuses everything):
#   1. installs docker.io and debootstrap from Debian's archive when missing (needs root);
#   2. starts dockerd in the background with its own socket, data root, exec root and pid
#      file, no bridge and no iptables rules (containers run with network "none");
#   3. builds a minimal image once: debootstrap --variant=minbase with python3-minimal and
#      the rest of the standard library (libpython3-stdlib: ctypes, resource, json's C
#      speedups, decimal... which programs under test import), tarred and cached under
#      DEW_SANDBOX_CACHE (default /var/cache/dew-sandbox, outside the repository) and
#      loaded with ``docker import`` as dew-sandbox-python:bookworm-stdlib.
#
# Being sourced, it never exits, always returns 0, never leaves ``set -e``/``-u``/``pipefail``
# changed in the caller's shell, and defines no lasting functions or variables besides the
# two exports.

# Remember the caller's errexit/nounset/pipefail ($- rather than $(set +o): a command
# substitution runs with errexit off, so it would misreport it).
_dew_engine_saved_flags="$-"
_dew_engine_saved_pipefail=off
[ -o pipefail ] && _dew_engine_saved_pipefail=on
set +e +u
set +o pipefail

_dew_engine_log() { echo "container engine: $*" >&2; }

_dew_engine_answers() {
    # True when the daemon on our socket answers an API call within a few seconds.
    timeout 10 docker -H "$1" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

_dew_engine_main() {
    local run_dir="/run/dew-docker"
    local socket="unix://${run_dir}/docker.sock"
    local data_root="/var/lib/dew-docker"
    local cache_dir="${DEW_SANDBOX_CACHE:-/var/cache/dew-sandbox}"
    local image="dew-sandbox-python:bookworm-stdlib"
    local tarball="${cache_dir}/bookworm-minbase-python3-stdlib.tar"
    local log="${run_dir}/dockerd.log"

    if [ "$(id -u)" != "0" ]; then
        _dew_engine_log "not started: needs root to run dockerd (uid $(id -u))"
        return 1
    fi
    mkdir -p "$run_dir" "$cache_dir" "$data_root" || {
        _dew_engine_log "not started: cannot create $run_dir, $cache_dir or $data_root"
        return 1
    }

    # 1. Packages.
    local missing=""
    command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
    command -v docker >/dev/null 2>&1 || missing="$missing docker.io"
    command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
    if [ -n "$missing" ]; then
        if ! command -v apt-get >/dev/null 2>&1; then
            _dew_engine_log "not started: missing$missing and no apt-get to install it"
            return 1
        fi
        _dew_engine_log "installing docker.io debootstrap (quietly)"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                docker.io debootstrap; } >"${run_dir}/apt.log" 2>&1; then
            _dew_engine_log "not started: apt-get failed; last lines of ${run_dir}/apt.log:"
            tail -n 15 "${run_dir}/apt.log" >&2
            return 1
        fi
    fi
    if ! command -v dockerd >/dev/null 2>&1; then
        _dew_engine_log "not started: dockerd is still missing after installing docker.io"
        return 1
    fi

    # 2. Daemon (reused when one already answers on our socket).
    if _dew_engine_answers "$socket"; then
        _dew_engine_log "reusing the dockerd already answering on $socket"
    else
        local pidfile="${run_dir}/dockerd.pid"
        if [ -f "$pidfile" ]; then
            local old_pid
            old_pid="$(cat "$pidfile" 2>/dev/null)"
            if [ -n "$old_pid" ] && kill -0 "$old_pid" 2>/dev/null; then
                _dew_engine_log "stopping unresponsive dockerd $old_pid"
                kill "$old_pid" 2>/dev/null
                sleep 3
                kill -0 "$old_pid" 2>/dev/null && kill -9 "$old_pid" 2>/dev/null
            fi
            rm -f "$pidfile"
        fi
        rm -f "${run_dir}/docker.sock"
        # setsid + nohup: the daemon leaves the caller's process group and survives it.
        setsid nohup dockerd \
            --host "$socket" \
            --data-root "$data_root" \
            --exec-root "${run_dir}/exec" \
            --pidfile "$pidfile" \
            --bridge=none --iptables=false --ip6tables=false \
            >"$log" 2>&1 </dev/null &
        local waited=0
        until _dew_engine_answers "$socket"; do
            if [ "$waited" -ge 60 ]; then
                _dew_engine_log "not started: dockerd did not answer on $socket within 60 s;" \
                    "last lines of $log:"
                tail -n 20 "$log" >&2
                return 1
            fi
            sleep 1
            waited=$((waited + 1))
        done
        _dew_engine_log "dockerd answering on $socket after ${waited} s"
    fi

    # 3. Image (imported from the cached rootfs tarball, built once per machine).
    if ! docker -H "$socket" image inspect "$image" >/dev/null 2>&1; then
        if [ ! -s "$tarball" ]; then
            if ! command -v debootstrap >/dev/null 2>&1; then
                _dew_engine_log "not started: debootstrap missing, cannot build $image"
                return 1
            fi
            local rootfs
            rootfs="$(mktemp -d "${cache_dir}/rootfs.XXXXXX")" || return 1
            _dew_engine_log "building the image rootfs with debootstrap (once per machine)"
            if ! debootstrap --variant=minbase --include=python3-minimal,libpython3-stdlib \
                bookworm "$rootfs" >"${cache_dir}/debootstrap.log" 2>&1; then
                _dew_engine_log "not started: debootstrap failed; last lines of" \
                    "${cache_dir}/debootstrap.log:"
                tail -n 15 "${cache_dir}/debootstrap.log" >&2
                rm -rf "$rootfs"
                return 1
            fi
            # Trim what a program never needs: package caches, lists, docs, locales.
            rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
                "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/locale
            if ! tar --numeric-owner -C "$rootfs" -cf "${tarball}.partial" .; then
                _dew_engine_log "not started: could not tar the rootfs"
                rm -rf "$rootfs" "${tarball}.partial"
                return 1
            fi
            mv -f "${tarball}.partial" "$tarball"
            rm -rf "$rootfs"
        else
            _dew_engine_log "importing the cached rootfs $tarball"
        fi
        if ! docker -H "$socket" import \
            --change 'CMD ["/usr/bin/python3"]' \
            --change 'WORKDIR /work' \
            "$tarball" "$image" >/dev/null 2>"${run_dir}/import.log"; then
            _dew_engine_log "not started: docker import failed:"
            tail -n 10 "${run_dir}/import.log" >&2
            return 1
        fi
    fi
    if ! timeout 60 docker -H "$socket" run --rm --network none "$image" \
        /usr/bin/python3 -c 'print("ok")' >/dev/null 2>"${run_dir}/smoke.log"; then
        _dew_engine_log "not started: a smoke container of $image failed:"
        tail -n 10 "${run_dir}/smoke.log" >&2
        return 1
    fi

    export DOCKER_HOST="$socket"
    export DEW_SANDBOX_IMAGE="$image"
    _dew_engine_log "ready: DOCKER_HOST=$DOCKER_HOST DEW_SANDBOX_IMAGE=$DEW_SANDBOX_IMAGE"
    return 0
}

_dew_engine_main
_dew_engine_ready=$?

unset -f _dew_engine_main _dew_engine_answers _dew_engine_log
case "$_dew_engine_saved_flags" in *e*) set -e ;; esac
case "$_dew_engine_saved_flags" in *u*) set -u ;; esac
[ "$_dew_engine_saved_pipefail" = on ] && set -o pipefail
unset _dew_engine_saved_flags _dew_engine_saved_pipefail
if [ "$_dew_engine_ready" != "0" ]; then
    echo "container engine: unavailable; DOCKER_HOST and DEW_SANDBOX_IMAGE not exported," \
        "container tests will skip (and fail under CI=true)" >&2
fi
unset _dew_engine_ready
# Always succeed: a caller running under ``set -e`` must survive a missing engine; the
# exports (or their absence) are the result.
true
