#!/usr/bin/env bash
# gearmand's own test programs against jobwire (`make gearmand-tests`).
#
# Builds gearmand's libtest programs (t/cli, t/client, ...) from its public repository into
# build/gearmand-suite (ignored; nothing of it is committed), puts gearmand-wrapper.sh where
# libtest spawns the server (./gearmand/gearmand), runs each program and prints a table.
#
#   GEARMAND_SRC=PATH       a gearmand git repository (bare or not) or source tree to take
#                           the sources from instead of cloning github.com/gearman/gearmand
#   GEARMAND_TAG=1.1.20     the release whose tests run
#   GEARMAND_SERVER=jobwire run against jobwire, or `gearmand` (the one built here: the
#                           baseline), or `both`
#   GEARMAND_PROGRAMS="..." which t/ programs (default below)
#   GEARMAND_TIMEOUT=300    seconds one program may run before it counts as hung
#   GEARMAND_WORK=DIR       where to build (default build/gearmand-suite)
#   JOBWIRE=PATH            the jobwire executable (default .venv/bin/jobwire)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${GEARMAND_WORK:-$ROOT/build/gearmand-suite}
TAG=${GEARMAND_TAG:-1.1.20}
SERVERS=${GEARMAND_SERVER:-jobwire}
PROGRAMS=${GEARMAND_PROGRAMS:-"gearmand cli worker client protocol multi_client round_robin internals ephemeral"}
TIMEOUT=${GEARMAND_TIMEOUT:-300}
JOBWIRE=$(realpath "${JOBWIRE:-$ROOT/.venv/bin/jobwire}")
SRC=$WORK/src
LOGS=$WORK/logs
JOBS=$(( $(nproc 2>/dev/null || echo 2) ))

say() { printf '== %s\n' "$*" >&2; }

# -- build dependencies ---------------------------------------------------------------------
missing=()
for tool in autoreconf libtoolize gperf g++ make pkg-config; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
for header in boost/program_options.hpp event2/event.h uuid/uuid.h; do
  printf '#include <%s>\n' "$header" | g++ -E -x c++ - >/dev/null 2>&1 || missing+=("$header")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing: ${missing[*]}"
  packages="autoconf automake libtool gperf g++ make pkg-config libboost-dev
            libboost-program-options-dev libevent-dev uuid-dev"
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages
  else
    say "install them (Debian/Ubuntu: apt-get install $(echo $packages)) and run again"
    exit 1
  fi
fi

# -- sources ----------------------------------------------------------------------------------
if [ ! -f "$SRC/configure.ac" ]; then
  mkdir -p "$SRC"
  if [ -n "${GEARMAND_SRC:-}" ]; then
    if git -C "$GEARMAND_SRC" rev-parse -q --verify "$TAG^{commit}" >/dev/null 2>&1; then
      say "gearmand $TAG from $GEARMAND_SRC"
      git -C "$GEARMAND_SRC" archive "$TAG" | tar -x -C "$SRC"
    elif [ -f "$GEARMAND_SRC/configure.ac" ]; then
      say "gearmand sources from $GEARMAND_SRC"
      cp -a "$GEARMAND_SRC/." "$SRC/"
    else
      say "GEARMAND_SRC=$GEARMAND_SRC is neither a git repository with $TAG nor a source tree"
      exit 1
    fi
  else
    say "cloning gearmand $TAG"
    tmp=$(mktemp -d)
    git clone -q --depth 1 --branch "$TAG" https://github.com/gearman/gearmand.git "$tmp/g"
    git -C "$tmp/g" archive HEAD | tar -x -C "$SRC"
    rm -rf "$tmp"
  fi
fi

# -- build ------------------------------------------------------------------------------------
cd "$SRC"
if [ ! -f Makefile ]; then
  say "configuring (log: $WORK/configure.log)"
  # GIT_CEILING_DIRECTORIES: configure names the version after `git describe`; the sources
  # are not a git checkout, and jobwire's repository around them must not be taken for one.
  ( export GIT_CEILING_DIRECTORIES=$WORK
    autoreconf -fi && ./configure --disable-dtrace --disable-libpq --disable-libmemcached \
      --disable-libtokyocabinet --disable-hiredis --disable-libdrizzle --without-mysql ) \
    >"$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log"; exit 1; }
fi
targets=(bin/gearman bin/gearadmin)
for program in $PROGRAMS; do targets+=("t/$program"); done
# gearmand/gearmand is built too (t/cli and t/gearmand depend on it): it is the baseline.
if [ -f gearmand/gearmand ] && grep -q "Stands in for gearmand" gearmand/gearmand; then
  rm gearmand/gearmand  # our stand-in: let make see the real one is missing
fi
say "building ${targets[*]} gearmand/gearmand (log: $WORK/build.log)"
# The generated headers first (a parallel build of single programs does not order them),
# and libtest's scratch tree (TMP_DIR: tmp_chroot/...), which the programs chdir into.
database=$(make -s -p -n 2>/dev/null)
built_sources=$(sed -n 's/^BUILT_SOURCES = //p' <<<"$database" | head -1 | tr ' ' '\n' \
  | grep -v '^\$' | sort -u | tr '\n' ' ')
tmp_dirs=$(sed -n 's/^TMP_DIR := //p' <<<"$database" | head -1)
# shellcheck disable=SC2086
{ mkdir -p $tmp_dirs && make $built_sources \
  && make -j"$JOBS" "${targets[@]}" gearmand/gearmand; } \
  >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
# The real gearmand (often a libtool wrapper script that finds the binary in .libs) moves
# aside; the stand-in takes its place.
mv gearmand/gearmand gearmand/gearmand.real
stand_in() {  # the stand-in for server $1; newer than gearmand's objects: make leaves it be
  sed -e "s|@SERVER@|$1|" -e "s|@JOBWIRE@|$JOBWIRE|" "$HERE/gearmand-wrapper.sh" \
    >gearmand/gearmand
  chmod +x gearmand/gearmand
}
stand_in jobwire

# -- run --------------------------------------------------------------------------------------
mkdir -p "$LOGS"
[ "$SERVERS" = both ] && SERVERS="gearmand jobwire"
for server in $SERVERS; do
  stand_in "$server"
  for program in $PROGRAMS; do
    log="$LOGS/$server-$program.log"
    say "$server: t/$program (log: $log)"
    set +e
    timeout -k 10 "$TIMEOUT" "./t/$program" >"$log" 2>&1
    echo "exit $?" >>"$log"
    set -e
    # A program stopped after the timeout leaves the servers it started (libtest puts them
    # in their own process group); stop them by the pid files libtest gave them.
    for pid_file in tmp_chroot/var/run/gearmand.pid*; do
      [ -f "$pid_file" ] || continue
      pid=$(cat "$pid_file" 2>/dev/null || true)
      [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
      rm -f "$pid_file"
    done
  done
done
exec "${PYTHON:-python3}" "$HERE/summarize.py" "$LOGS" $SERVERS -- $PROGRAMS
