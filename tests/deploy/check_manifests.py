"""Checks rendered Kubernetes manifests (`kubectl kustomize` output on stdin) for the
references kubectl itself does not check until pods fail to start:
  - every volume's Secret or ConfigMap is among the rendered resources;
  - every volumeMount names a volume of its pod (or a volumeClaimTemplate);
  - every file a container's command, args or probes name under a Secret's or
    ConfigMap's mount is a key of that Secret or ConfigMap;
  - every Service selects a workload and its targetPorts are ports of that workload's
    containers; every StatefulSet's serviceName is a Service;
  - containers run as non-root without privilege escalation.
Prints each problem; exits 1 if there is any."""
import re
import sys

import yaml

docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
problems = []


def keys(kind, name):
    d = by_kind.get(kind, {}).get(name)
    return None if d is None else set((d.get("data") or {}).keys()) | set((d.get("binaryData") or {}).keys())


workloads = []  # (kind/name, pod template, claim names)
for kind in ("StatefulSet", "Deployment", "Job", "DaemonSet"):
    for name, d in by_kind.get(kind, {}).items():
        claims = [c["metadata"]["name"] for c in d["spec"].get("volumeClaimTemplates", [])]
        workloads.append((f"{kind}/{name}", d["spec"]["template"], claims))
        if kind == "StatefulSet" and d["spec"].get("serviceName") not in by_kind.get("Service", {}):
            problems.append(f"{kind}/{name}: serviceName {d['spec'].get('serviceName')} is no Service")

for where, template, claims in workloads:
    spec = template["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    pod_security = spec.get("securityContext", {})
    for v in volumes.values():
        if "secret" in v and keys("Secret", v["secret"]["secretName"]) is None:
            problems.append(f"{where}: volume {v['name']}: no Secret {v['secret']['secretName']}")
        if "configMap" in v and keys("ConfigMap", v["configMap"]["name"]) is None:
            problems.append(f"{where}: volume {v['name']}: no ConfigMap {v['configMap']['name']}")
    for c in spec["containers"]:
        mounts = {}
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes and m["name"] not in claims:
                problems.append(f"{where}/{c['name']}: mount {m['name']} has no volume")
            mounts[m["mountPath"].rstrip("/")] = volumes.get(m["name"], {})
        words = list(c.get("command", [])) + list(c.get("args", []))
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            words += c.get(probe, {}).get("exec", {}).get("command", [])
        for path in re.findall(r"(/[\w./$-]+)", " ".join(words)):
            directory, _, file = path.rpartition("/")
            volume = mounts.get(directory)
            if not volume or not file:
                continue
            if "secret" in volume:
                have = keys("Secret", volume["secret"]["secretName"]) or set()
            elif "configMap" in volume:
                have = keys("ConfigMap", volume["configMap"]["name"]) or set()
            else:
                continue
            # $n-style names (one per pod) must match some key with anything in place of $n.
            pattern = re.escape(file).replace(r"\$n", ".+")
            if not any(re.fullmatch(pattern, k) for k in have):
                problems.append(f"{where}/{c['name']}: {path} is not a key of its volume ({sorted(have)})")
        security = {**pod_security, **c.get("securityContext", {})}
        if not security.get("runAsNonRoot") or security.get("allowPrivilegeEscalation", True):
            problems.append(f"{where}/{c['name']}: may run as root or escalate privileges")

for name, svc in by_kind.get("Service", {}).items():
    selector = svc["spec"].get("selector", {})
    selected = [(w, t) for w, t, _ in workloads
                if selector and all(t["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
    if not selected:
        problems.append(f"Service/{name}: selects no workload ({selector})")
    for port in svc["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        for w, t in selected:
            ports = [p for c in t["spec"]["containers"] for p in c.get("ports", [])]
            if not any(p.get("name") == target or p["containerPort"] == target for p in ports):
                problems.append(f"Service/{name}: targetPort {target} is not a port of {w}")

for p in problems:
    print(p)
print(f"{len(docs)} resources, {len(problems)} problems")
sys.exit(1 if problems else 0)
