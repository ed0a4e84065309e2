#!/usr/bin/env bash
# Runs the chaos run (tools/outbox-chaos): writers commit events while publisher processes
# send them to RocketMQ, a consumer records every delivery, and inbox consumer processes
# (package inbox) write one effect row per event; meanwhile publishers and consumers are
# SIGKILLed, the broker and the database are restarted. Prints the table and exits non-zero
# if an event was lost, dead-lettered or left SENDING, a duplicate has no explanation, or an
# event's effect was lost, doubled or rejected.
#
#   bash scripts/chaos.sh -short      CI: 3,000 events over 2 minutes, one fault of each kind
#   bash scripts/chaos.sh -short -relay
#                                     the same with a binlog relay in each publisher process
#                                     (the database runs with the binlog on): the relay leader
#                                     killed, the database restarted and crashed, the binlog
#                                     purged while the leader is down
#   bash scripts/chaos.sh             100,000 events, 10 minutes of random faults
#   bash scripts/chaos.sh -h          every flag
#
# It starts its own MariaDB (127.0.0.1:3307, under /tmp/outbox-chaos-mariadb) and RocketMQ
# (name server 127.0.0.1:9886, broker 127.0.0.1:10941, under /tmp/outbox-chaos-rocketmq)
# with scripts/mariadb.sh and scripts/rocketmq.sh, restarts only those, and stops them at the
# end (-keep leaves them running). Logs go to /tmp/outbox-chaos-run/<run>/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${TMPDIR:-/tmp}/outbox-chaos-bin"
mkdir -p "$bin"
go -C tools build -o "$bin/outbox-chaos" ./outbox-chaos # a module of its own
exec "$bin/outbox-chaos" -scripts scripts "$@"
