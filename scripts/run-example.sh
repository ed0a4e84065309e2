#!/usr/bin/env bash
# Sets up MariaDB and RocketMQ on this machine (installing what is missing) and runs the
# order-service example. Flags go to the example, e.g. -orders 1000 -instances 3.
set -euo pipefail
cd "$(dirname "$0")/.."

dsn="$(bash scripts/mariadb.sh start)"
rocketmq_env="$(bash scripts/rocketmq.sh start)" # a failed start ends the script here
eval "$rocketmq_env"                              # exports OUTBOX_TEST_ROCKETMQ_NAMESRV
go -C examples run ./order-service -dsn "$dsn" -namesrv "$OUTBOX_TEST_ROCKETMQ_NAMESRV" "$@"
