#!/usr/bin/env bash
# What a large sweep of the embedded store costs a light load's writes, for
# ledgerd configurations in turns. Each turn starts a fresh ledgerd with
#   --retention 60s --tombstone-retention 0
# and the configuration's flags (its sweeps a minute apart, the default),
# fills it from 128 clients for 40 s (about 500,000 records on the
# reference machine), and offers 300 fresh pairs a second from one client
# (ledgerbench -rate: open loop, timed from when each is due) for 10 s
# before the records expire, and for 30 s from its sweep two minutes in,
# the first that finds them expired. It counts the changes of ledgerd's Ps
# in its debug log, and those a sweep's hold made.
#
#   lab/sweep-tail.sh TURNS NAME='[LEDGERD] FLAGS' [NAME='[LEDGERD] FLAGS' ...]
#   lab/sweep-tail.sh 3 max='--procs max' auto='--procs auto' old='/tmp/ledgerd-old --procs auto'
#
# A configuration's first word, when it is not a flag, is the ledgerd
# binary to run; the others run the one it builds. Run it from the
# repository's root.
set -euo pipefail
turns=$1
shift
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/ledgerd ./lab/cmd/ledgerbench
addr=127.0.0.1:17290
paced() { "$bin/ledgerbench" -addr "$addr" -api stream -rate 300 -duration "$1" 2> /dev/null | grep -m1 "| paced |"; }
for turn in $(seq "$turns"); do
	for config in "$@"; do
		name=${config%%=*}
		read -r -a flags <<< "${config#*=}"
		ledgerd=$bin/ledgerd
		if [[ ${#flags[@]} -gt 0 && ${flags[0]} != -* ]]; then
			ledgerd=${flags[0]}
			flags=("${flags[@]:1}")
		fi
		rm -rf "$bin/data"
		echo "=== $name (${config#*=}) turn $turn $(date +%T)"
		"$ledgerd" --data-dir "$bin/data" --listen "$addr" --admin-listen "" --log-level debug \
			--retention 60s --tombstone-retention 0 "${flags[@]}" > "$bin/log" 2>&1 &
		pid=$!
		started=$(date +%s)
		until (exec 3<> "/dev/tcp/${addr%:*}/${addr#*:}") 2> /dev/null; do sleep 0.1; done
		"$bin/ledgerbench" -addr "$addr" -api stream -workloads fresh -clients 128 -duration 40s -rounds 1 2> /dev/null |
			grep -m1 "| fresh |" | sed 's/^/fill: /'
		echo "before the sweep: $(paced 10s)"
		sleep $((started + 121 - $(date +%s)))
		echo "during the sweep: $(paced 30s)"
		echo "changes of the Ps: $(grep -c '"GOMAXPROCS set"' "$bin/log" || true), held: $(grep -c '"GOMAXPROCS set".*"held":true' "$bin/log" || true)"
		kill "$pid"
		wait "$pid" || true
	done
done
