#!/usr/bin/env bash
# Finds the headless browser the console's end-to-end test drives (tools/console-e2e), and
# installs it from Debian's packages if it is missing.
#
#   scripts/chromium.sh install   install chromium and chromium-driver from Debian's packages
#                                 if the browser is missing, check that it starts headless,
#                                 and print its path (the default command)
#   scripts/chromium.sh path      print the browser's path; exit 1 if there is none
#
# The path printed is what the test reads from OUTBOX_TEST_CHROMIUM (.ci/run exports it).
# Without that variable the test looks for chromium on PATH; with OUTBOX_REQUIRE_SERVICES=1 a
# browser it cannot find or start fails the test, as a missing database does.
#
# Environment (optional): OUTBOX_TEST_CHROMIUM, a browser to use instead of Debian's
# (a Chrome or Chromium of another origin); the script checks that it runs and prints it.
set -euo pipefail

find_browser() {
	if [ -n "${OUTBOX_TEST_CHROMIUM:-}" ]; then
		if [ -x "$OUTBOX_TEST_CHROMIUM" ]; then
			echo "$OUTBOX_TEST_CHROMIUM"
			return 0
		fi
		echo "OUTBOX_TEST_CHROMIUM=$OUTBOX_TEST_CHROMIUM is not an executable file" >&2
		return 2
	fi
	local name
	for name in chromium chromium-browser; do
		if command -v "$name" >/dev/null 2>&1; then
			command -v "$name"
			return 0
		fi
	done
	return 1
}

install() {
	local found rc=0
	found=$(find_browser) || rc=$?
	if [ "$rc" -eq 2 ]; then
		exit 1
	fi
	if [ "$rc" -ne 0 ]; then
		if [ "$(id -u)" -ne 0 ]; then
			echo "chromium is not installed and this is not root: install it with apt-get install chromium chromium-driver" >&2
			exit 1
		fi
		echo "installing chromium and chromium-driver from Debian's packages" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
		found=$(find_browser) || {
			echo "chromium was installed but is not on PATH" >&2
			exit 1
		}
	fi
	# It must start headless on this machine (as root in a container: no sandbox), with the
	# flags the test gives it; a browser that cannot is as missing as one not installed.
	local out
	if ! out=$("$found" --headless --no-sandbox --disable-gpu --disable-background-networking \
		--disable-component-update --no-first-run --dump-dom 'data:text/html,<p id=ok>ok</p>' 2>&1); then
		echo "$found does not start headless:" >&2
		echo "$out" | tail -n 20 >&2
		exit 1
	fi
	if ! grep -q 'id="ok"' <<<"$out"; then
		echo "$found started headless but rendered no page:" >&2
		echo "$out" | tail -n 20 >&2
		exit 1
	fi
	echo "chromium: $("$found" --version 2>/dev/null || echo "$found")" >&2
	echo "$found"
}

case "${1:-install}" in
install) install ;;
path)
	find_browser || {
		echo "no chromium found: run scripts/chromium.sh install (as root), or set OUTBOX_TEST_CHROMIUM" >&2
		exit 1
	}
	;;
*)
	echo "usage: $0 [install|path]" >&2
	exit 2
	;;
esac
