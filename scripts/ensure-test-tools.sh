#!/usr/bin/env bash
# Test tools beyond the venv, pinned: Debian's chromium (the plan report's browser test,
# tests/integration/test_plan_report_browser.py), Debian's haproxy (the gateway's routing test,
# tests/integration/test_gateway_routing.py: the package the gateway role installs on a bookworm host) and promtool
# from Debian's prometheus package (the alert rules' unit tests, tests/integration/test_observability_role.py).
# .ci/run calls it; `make setup` too.
# chromium: measured on the 2-core machine: 28 s, 25 packages, 395 MB installed.
# promtool: only the binary, extracted from the pinned .deb into .cache/tools/ (no service installed or started,
#   no root needed; 19 MB download, 48 MB binary, ~4 s).
set -euo pipefail
cd "$(dirname "$0")/.."
PROMETHEUS_DEB_VERSION=${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}
TOOLS=.cache/tools
PROMTOOL=$TOOLS/prometheus-$PROMETHEUS_DEB_VERSION/promtool

# chromium and haproxy: Debian's package, apt-get install when root (haproxy: only its binary is run by the test; a
#   host without systemd starts no service); otherwise a note, and the test that needs it skips (under CI=true it
#   fails instead).
# Usage: apt_tool COMMAND PURPOSE, e.g. apt_tool chromium "the plan report's browser test"
apt_tool() {
  local tool=$1 purpose=$2
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "ensure-test-tools: installing $tool (Debian's package, for $purpose)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$tool" >/dev/null
  else
    echo "ensure-test-tools: $tool is missing: $purpose will be skipped (as root: apt-get install $tool)"
  fi
}
apt_tool chromium "the plan report's browser test"
apt_tool haproxy "the gateway's routing test"

if [ ! -x "$PROMTOOL" ]; then
  command -v apt-get >/dev/null || { echo "ensure-test-tools: promtool needs apt-get (Debian's prometheus package)" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "ensure-test-tools: extracting promtool from Debian's prometheus $PROMETHEUS_DEB_VERSION"
  if ! (cd "$work" && apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION" 2>/dev/null); then
    [ "$(id -u)" = 0 ] && apt-get update -qq
    (cd "$work" && apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION") || {
      echo "ensure-test-tools: prometheus=$PROMETHEUS_DEB_VERSION is not in this machine's apt sources;" \
        "see apt-cache policy prometheus and set PROMETHEUS_DEB_VERSION" >&2
      exit 1
    }
  fi
  dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work" ./usr/bin/promtool
  mkdir -p "$(dirname "$PROMTOOL")"
  mv "$work/usr/bin/promtool" "$PROMTOOL"
fi
