#!/usr/bin/env bash
# scripts/postgres.sh: a throwaway PostgreSQL cluster for the tests and benchmarks of the
# postgres/ connector and of bench/ (S6).
#
#   scripts/postgres.sh start    create (first time) and start the cluster; print its URL
#   scripts/postgres.sh url      print the URL of the running cluster
#   scripts/postgres.sh status   exit 0 when the cluster runs
#   scripts/postgres.sh crash    stop it the hard way (pg_ctl stop -m immediate), for fault tests
#   scripts/postgres.sh stop     stop it and delete it
#
# The cluster uses Debian's PostgreSQL (the package is installed with apt-get when
# initdb is missing), listens on loopback only, on a free port, with fsync off (but
# synchronous commit on, so that a crashed server keeps every acknowledged commit): it is
# for tests, not for data. Its files live in a temporary folder; .pgdata/state (git
# ignored) remembers where. initdb and pg_ctl run as the postgres user when this runs as
# root (PostgreSQL refuses to run as root), else as the current user. The URL follows
# pgx's convention for DATABASE_URL.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
statedir=$PWD/.pgdata
state=$statedir/state

die() {
	echo "postgres.sh: $*" >&2
	exit 1
}

# pgbin prints the folder of initdb and pg_ctl, installing PostgreSQL if needed.
pgbin() {
	local d
	if d=$(command -v initdb 2>/dev/null); then
		dirname "$(readlink -f "$d")"
		return
	fi
	d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)
	if [[ -z $d ]]; then
		[[ $(id -u) == 0 ]] || die "initdb not found; install PostgreSQL (apt-get install postgresql) or run as root"
		echo "postgres.sh: installing PostgreSQL with apt-get" >&2
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
		d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d | sort -V | tail -1)
		[[ -n $d ]] || die "apt-get installed no PostgreSQL server"
	fi
	echo "$d"
}

# as_pg runs a command as the cluster's owner.
as_pg() {
	if [[ $(id -u) == 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# free_port prints a TCP port nothing listens on at 127.0.0.1.
# It picks below the kernel's range of ephemeral ports (32768 by default): a port there
# may be the local end of another program's connection (a test's client of a loopback
# server), which no listener shows, and PostgreSQL's bind then fails ("Address already
# in use"; seen once while other tests ran).
free_port() {
	local port i lo=32768
	if [[ -r /proc/sys/net/ipv4/ip_local_port_range ]]; then
		read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
	fi
	((lo > 11000)) || lo=32768
	for ((i = 0; i < 200; i++)); do
		port=$((10000 + RANDOM % (lo - 10000)))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
	die "no free port found"
}

load_state() {
	[[ -f $state ]] || return 1
	# shellcheck source=/dev/null
	source "$state"
	[[ -n ${PGDATA_DIR:-} && -d $PGDATA_DIR ]]
}

url() { echo "postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=disable"; }

running() { load_state && as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; }

start() {
	if ! load_state; then
		BIN=$(pgbin)
		PORT=$(free_port)
		PGDATA_DIR=$(mktemp -d /tmp/pipeline-pg.XXXXXX)
		if [[ $(id -u) == 0 ]]; then
			chown postgres: "$PGDATA_DIR"
		fi
		chmod 700 "$PGDATA_DIR"
		as_pg "$BIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null ||
			die "initdb failed"
		mkdir -p "$statedir"
		printf 'BIN=%q\nPORT=%q\nPGDATA_DIR=%q\n' "$BIN" "$PORT" "$PGDATA_DIR" >"$state"
	fi
	if ! running; then
		as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR" -l "$PGDATA_DIR/server.log" -w -t 60 start -o \
			"-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$PGDATA_DIR -c fsync=off -c full_page_writes=off -c max_connections=200" >/dev/null ||
			{
				tail -20 "$PGDATA_DIR/server.log" >&2 || true
				die "pg_ctl start failed"
			}
	fi
	url
}

case ${1:-} in
start) start ;;
url)
	running || die "no cluster runs; start one with scripts/postgres.sh start"
	url
	;;
status) running ;;
crash)
	load_state || die "no cluster"
	as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR" -m immediate -w stop >/dev/null
	;;
stop)
	if load_state; then
		as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w stop >/dev/null 2>&1 || true
		rm -rf "$PGDATA_DIR"
	fi
	rm -rf "$statedir"
	;;
*)
	echo "usage: scripts/postgres.sh start|stop|url|status|crash" >&2
	exit 2
	;;
esac
