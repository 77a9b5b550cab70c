#!/usr/bin/env bash
# Checks deploy/kubernetes/ (CI runs this after the build):
#   1. every manifest against the Kubernetes API schemas of the oldest and the
#      newest version we claim, strictly (unknown fields are errors), with
#      kubernetes-validate from .venv (scripts/setup.sh pins it). Custom
#      resources (the ServiceMonitor) have no schema there: they are only
#      parsed, and said so;
#   2. that the pieces agree: the DaemonSet runs rmmd with the unit's flags
#      and as the Dockerfile's uid/gid, the ConfigMap allows that gid, the
#      client pod joins it;
#   3. the ConfigMap's rmmd.conf with `rmmd --check-config` (the built
#      build/daemon/rmmd, or --rmmd PATH; skipped, saying so, without one).
#   scripts/validate-manifests.sh [--rmmd PATH]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
rmmd=build/daemon/rmmd
if [ "${1:-}" = --rmmd ]; then rmmd=$2; shift 2; fi
versions=(1.30.0 1.37.0)
venv=${RMMD_VENV:-$root/.venv}
kv=$venv/bin/kubernetes-validate
[ -x "$kv" ] || ./scripts/setup.sh
manifests=(deploy/kubernetes/*.yaml)

echo "--- kubernetes-validate $("$kv" --version) --strict, Kubernetes ${versions[*]}"
args=(--strict)
for v in "${versions[@]}"; do args+=(-k "$v"); done
out=$(mktemp)
trap 'rm -f "$out" "${conf:-}"' EXIT
rc=0
"$kv" "${args[@]}" "${manifests[@]}" >"$out" 2>&1 || rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: kubernetes-validate exited $rc" >&2; exit 1; }
# A warning is a kind without a schema: only the Prometheus operator's CRD
# may be one (a typo in apiVersion or kind would also land here).
if grep '^WARN' "$out" | grep -v 'monitoring.coreos.com/v1/ServiceMonitor\|kind ServiceMonitor' >&2; then
  echo "FAIL: the kinds above have no schema in kubernetes-validate (a misspelt apiVersion or kind?)" >&2
  exit 1
fi
if grep -q '^WARN' "$out"; then
  echo "note: the ServiceMonitor is a custom resource (Prometheus operator): parsed, not validated"
fi

echo "--- the manifests, the Dockerfile and the unit agree"
"$venv/bin/python" - <<'EOF'
import re, shlex, sys, yaml

def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]

def fail(msg):
    sys.exit("FAIL: " + msg)

k = "deploy/kubernetes/"
ds = load(k + "daemonset.yaml")[0]
cm = load(k + "configmap.yaml")[0]
pod = load(k + "client-pod-example.yaml")[0]
spec = ds["spec"]["template"]["spec"]
docker = open("deploy/container/Dockerfile").read()
arg = lambda n: int(re.search(r"^ARG %s=(\d+)$" % n, docker, re.M).group(1))
uid, gid = arg("RMMD_UID"), arg("RMMD_GID")

if (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) != (uid, gid):
    fail("the DaemonSet runs as %s:%s, the image's rmmd is %d:%d" % (
        spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"], uid, gid))
init = " ".join(spec["initContainers"][0]["command"])
if "chown %d:%d /run/rmmd" % (uid, gid) not in init:
    fail("the init container does not give /run/rmmd to %d:%d: %s" % (uid, gid, init))
conf = cm["data"]["rmmd.conf"]
if not re.search(r"^allowed_gids: %d$" % gid, conf, re.M):
    fail("the ConfigMap's rmmd.conf does not allow gid %d" % gid)
if gid not in pod["spec"]["securityContext"].get("supplementalGroups", []):
    fail("the client pod is not in gid %d" % gid)

# The unit's ExecStart flags, as the DaemonSet passes them.
unit = open("deploy/systemd/rmmd.service").read()
exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))
container = spec["containers"][0]
if exec_start[1:] != container["args"]:
    fail("the DaemonSet's args %s are not the unit's ExecStart flags %s" % (container["args"], exec_start[1:]))
env = {e["name"]: e["value"] for e in container["env"]}
for m in re.finditer(r"^Environment=(\w+)=(.*)$", unit, re.M):
    if env.get(m.group(1)) != m.group(2):
        fail("the DaemonSet lacks the unit's Environment=%s=%s" % (m.group(1), m.group(2)))
print("ok: rmmd as %d:%d with the unit's flags %s and environment; gid %d allowed and joined by the client pod"
      % (uid, gid, " ".join(exec_start[1:]), gid))
EOF

echo "--- the ConfigMap's rmmd.conf: rmmd --check-config"
if [ ! -x "$rmmd" ]; then
  echo "skipped: no rmmd at $rmmd (build it, or pass --rmmd PATH)"
else
  conf=$(mktemp --suffix=.conf)
  "$venv/bin/python" -c 'import sys, yaml; print(next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d)["data"]["rmmd.conf"], end="")' \
    deploy/kubernetes/configmap.yaml >"$conf"
  "$rmmd" --check-config "$conf"
fi
echo "PASS: deploy/kubernetes/"
