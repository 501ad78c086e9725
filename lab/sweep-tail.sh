#!/usr/bin/env bash
# What a large sweep of the embedded store costs a light load's writes, for
# ledgerd configurations in turns. Each turn starts a fresh ledgerd with
#   --retention 60s --tombstone-retention 0 --sweep-interval 1s
# and the configuration's flags, fills it from 128 clients for 40 s (about
# 500,000 records on the reference machine), offers 300 fresh pairs a
# second from one client (ledgerbench -rate: open loop, timed from when
# each is due) for 10 s before the records expire and for 30 s while they
# are swept, and counts the changes of ledgerd's Ps in its debug log.
#
#   lab/sweep-tail.sh TURNS NAME='FLAGS' [NAME='FLAGS' ...]
#   lab/sweep-tail.sh 3 max='--procs max' auto='--procs auto'
#
# Run it from the repository's root; it builds ledgerd and ledgerbench.
set -euo pipefail
turns=$1
shift
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/ledgerd ./lab/cmd/ledgerbench
addr=127.0.0.1:17290
for turn in $(seq "$turns"); do
	for config in "$@"; do
		name=${config%%=*}
		flags=${config#*=}
		dir="$bin/data"
		rm -rf "$dir"
		echo "=== $name ($flags) turn $turn $(date +%T)"
		# shellcheck disable=SC2086 # the flags are words
		"$bin/ledgerd" --data-dir "$dir" --listen "$addr" --admin-listen "" --log-level debug \
			--retention 60s --tombstone-retention 0 --sweep-interval 1s $flags 2> "$bin/log" &
		pid=$!
		until (exec 3<>"/dev/tcp/${addr%:*}/${addr#*:}") 2> /dev/null; do sleep 0.1; done
		filled=$(( $(date +%s) + 60 ))
		"$bin/ledgerbench" -addr "$addr" -api stream -workloads fresh -clients 128 -duration 40s -rounds 1 |
			grep -m1 "fresh " | sed 's/^/fill: /'
		"$bin/ledgerbench" -addr "$addr" -api stream -rate 300 -duration 10s | grep -m1 " paced " | sed 's/^/before the sweep: /'
		sleep $(( filled - $(date +%s) > 0 ? filled - $(date +%s) : 0 ))
		"$bin/ledgerbench" -addr "$addr" -api stream -rate 300 -duration 30s | grep -m1 " paced " | sed 's/^/during the sweep: /'
		echo "changes of the Ps: $(grep -c '"GOMAXPROCS set"' "$bin/log" || true)"
		kill "$pid"
		wait "$pid" || true
	done
done
