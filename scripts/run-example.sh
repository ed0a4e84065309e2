#!/usr/bin/env bash
# Sets up MariaDB and RocketMQ on this machine (installing what is missing) and runs the
# order-service example with -check: it places the orders, waits until the points service
# has handled every event, and prints what the run did. Flags go to the example, e.g.
# -orders 1000 -instances 3, -ordered, -metrics-addr 127.0.0.1:9464.
set -euo pipefail
cd "$(dirname "$0")/.."

dsn="$(bash scripts/mariadb.sh start)"
# The example's topics: -ordered routes ORDER_SHIPPED to a topic of its own.
rocketmq_env="$(OUTBOX_ROCKETMQ_TOPICS="ORDER_EVENT_TOPIC ORDER_SHIPPED_TOPIC" bash scripts/rocketmq.sh start)" # a failed start ends the script here
eval "$rocketmq_env"                              # exports OUTBOX_TEST_ROCKETMQ_NAMESRV
go -C examples run ./order-service -dsn "$dsn" -namesrv "$OUTBOX_TEST_ROCKETMQ_NAMESRV" -check "$@"
