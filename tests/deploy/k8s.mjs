// Validates deploy/k8s offline: every manifest the kustomization lists against the Kubernetes
// schemas that the pinned kubernetes-models package bundles, strictly (a field the schema does
// not define is an error, as kubeconform -strict or kubectl's server-side field validation would
// say), then the promises sluice's deployment depends on, which no schema can see (probes on
// /readyz and /healthz, the grace period above preStop + drain_timeout_ms, the security context,
// the scrape annotations, references between the objects). Writes the Secret's sluice.json to
// OUT_DIR for `sluice --check-config`.
//
// usage: node tests/deploy/k8s.mjs DEPLOY_K8S_DIR OUT_DIR
// Prints one "ok:" line per object and per promise, then every problem as a "FAIL:" line and
// exits 1 when there is any (before the promises when an object is invalid); 2 on bad usage.
import { readFileSync, readdirSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { createRequire } from "node:module";
import { parseAllDocuments } from "yaml";

const [dir, outDir] = process.argv.slice(2);
if (!dir || !outDir) {
  console.error("usage: node k8s.mjs DEPLOY_K8S_DIR OUT_DIR");
  process.exit(2);
}
const require = createRequire(import.meta.url);
const modelsVersion = require("kubernetes-models/package.json").version;
console.log(`kubernetes-models ${modelsVersion} (its README: Kubernetes 1.27 schemas)`);

const problems = [];
const fail = (msg) => problems.push(msg);

function readYaml(file) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  const out = [];
  for (const d of docs) {
    for (const e of d.errors) fail(`${file}: YAML: ${e.message}`);
    for (const w of d.warnings) fail(`${file}: YAML: ${w.message}`);
    const v = d.toJS();
    if (v !== null && v !== undefined) out.push(v);
  }
  return out;
}

// The schema validator reads every property it knows; a property it never reads is unknown.
// Each object is wrapped in a Proxy that records the keys read (and enumerated, for maps such
// as labels), so no second copy of the schemas is needed to find typos such as readinesProbe.
function track(value, path, seen) {
  if (Array.isArray(value)) return value.map((v, i) => track(v, `${path}/${i}`, seen));
  if (value === null || typeof value !== "object") return value;
  const copy = {};
  for (const k of Object.keys(value)) copy[k] = track(value[k], `${path}/${k}`, seen);
  const read = new Set();
  seen.push({ path, keys: Object.keys(value), read });
  return new Proxy(copy, {
    get(t, k, r) {
      if (typeof k === "string") read.add(k);
      return Reflect.get(t, k, r);
    },
    ownKeys(t) {
      for (const k of Reflect.ownKeys(t)) if (typeof k === "string") read.add(k);
      return Reflect.ownKeys(t);
    },
  });
}

async function modelFor(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string") return null;
  try {
    const mod = await import(`kubernetes-models/${apiVersion}`);
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

async function validateObject(file, obj) {
  const where = `${file}: ${obj?.kind ?? "?"} ${obj?.metadata?.name ?? "?"}`;
  const Model = await modelFor(obj?.apiVersion, obj?.kind);
  if (!Model) {
    fail(`${where}: no schema for apiVersion "${obj?.apiVersion}" kind "${obj?.kind}"`);
    return false;
  }
  const seen = [];
  try {
    Model.prototype.validate.call(track(obj, "", seen));
  } catch (e) {
    fail(`${where}: ${e.message}`);
    return false;
  }
  const unknown = [];
  for (const { path, keys, read } of seen)
    for (const k of keys) if (!read.has(k)) unknown.push(`${path}/${k}`);
  // Report the outermost unknown field only (its own fields were never read either).
  const outer = unknown.filter((u) => !unknown.some((o) => o !== u && u.startsWith(o + "/")));
  for (const u of outer) fail(`${where}: unknown field ${u}`);
  if (!outer.length) console.log(`ok: ${where} is valid (schema, no unknown fields)`);
  return outer.length === 0;
}

// --- the kustomization -----------------------------------------------------------------------
const kfile = join(dir, "kustomization.yaml");
const [kust] = readYaml(kfile);
const kustKeys = ["apiVersion", "kind", "resources", "labels", "images", "namespace",
                  "commonAnnotations", "namePrefix", "nameSuffix"];
if (!kust || kust.apiVersion !== "kustomize.config.k8s.io/v1beta1" || kust.kind !== "Kustomization")
  fail(`${kfile}: not a kustomize.config.k8s.io/v1beta1 Kustomization`);
for (const k of Object.keys(kust ?? {}))
  if (!kustKeys.includes(k)) fail(`${kfile}: field "${k}" is not one this check knows`);
const resources = Array.isArray(kust?.resources) ? kust.resources : [];
for (const r of resources) if (!existsSync(join(dir, r))) fail(`${kfile}: resource ${r} missing`);
for (const f of readdirSync(dir))
  if (/\.ya?ml$/.test(f) && f !== "kustomization.yaml" && !resources.includes(f))
    fail(`${kfile}: ${f} is not listed in resources`);
for (const img of kust?.images ?? [])
  if (typeof img?.name !== "string" || !(img.newTag || img.newName || img.digest))
    fail(`${kfile}: images entries need a name and newTag, newName or digest`);

// --- every object ----------------------------------------------------------------------------
const objects = [];
for (const r of resources) {
  if (!existsSync(join(dir, r))) continue;
  for (const obj of readYaml(join(dir, r))) {
    await validateObject(r, obj);
    objects.push(obj);
  }
}
if (problems.length) finish();

// --- what the deployment promises ------------------------------------------------------------
const byKind = (kind) => objects.filter((o) => o.kind === kind);
const check = (cond, ok, bad) => (cond ? console.log(`ok: ${ok}`) : fail(bad ?? `not so: ${ok}`));

const [dep] = byKind("Deployment");
const secrets = byKind("Secret");
check(dep, "a Deployment", "no Deployment in the kustomization");
if (!dep) finish();
const pod = dep.spec.template.spec;
const podLabels = dep.spec.template.metadata?.labels ?? {};
const c = pod.containers.find((x) => x.name === "sluice") ?? pod.containers[0];
const portNames = new Map((c.ports ?? []).map((p) => [p.name, p.containerPort]));
const portOf = (p) => (typeof p === "number" ? p : portNames.get(p));

// The configuration, from the Secret the config volume names.
const configVolume = (pod.volumes ?? []).find((v) =>
  (c.volumeMounts ?? []).some((m) => m.name === v.name && m.mountPath === "/etc/sluice"));
const secretName = configVolume?.secret?.secretName;
check(secretName, "/etc/sluice is mounted from a Secret");
const secret = secrets.find((s) => s.metadata.name === secretName);
check(secret, `the Secret ${secretName} is part of the kustomization`);
const configText = secret?.stringData?.["sluice.json"] ??
  (secret?.data?.["sluice.json"] && Buffer.from(secret.data["sluice.json"], "base64").toString());
let config = null;
try {
  config = JSON.parse(configText);
  writeFileSync(join(outDir, "sluice.json"), configText);
  console.log(`ok: the Secret's sluice.json is JSON (written to ${join(outDir, "sluice.json")})`);
} catch (e) {
  fail(`${secretName}: sluice.json is not JSON: ${e.message}`);
}
const args = [...(c.command ?? []), ...(c.args ?? [])];
check(args.join(" ").includes("--config /etc/sluice/sluice.json"),
  "the container runs sluice --config /etc/sluice/sluice.json");

// Ports: the configuration's listen port is the container port every probe, the Service and the
// scrape annotation use.
const listenPort = config && Number(String(config.listen ?? "").split(":").pop());
const httpPort = portNames.get("http");
check(config && listenPort === httpPort,
  `the configuration listens on the container port http (${httpPort})`,
  `the configuration's listen "${config?.listen}" is not on the container port http (${httpPort})`);
check(/^(0\.0\.0\.0|\[::\]):/.test(String(config?.listen)),
  "the configuration listens on every interface of the pod",
  `listen "${config?.listen}" is not reachable from outside the pod`);

const probe = (name, path) => {
  const p = c[name];
  check(p?.httpGet?.path === path && portOf(p.httpGet.port) === httpPort,
    `${name} is GET ${path} on the http port`,
    `${name} must be GET ${path} on the http port`);
};
probe("readinessProbe", "/readyz");
probe("livenessProbe", "/healthz");
if (c.startupProbe) probe("startupProbe", "/healthz");

// Shutdown: preStop, then SIGTERM and the drain, all within the grace period.
const pre = c.lifecycle?.preStop?.exec?.command ?? [];
const preSleep = pre[0] === "sleep" || pre[0] === "/bin/sleep" ? Number(pre[1]) : NaN;
check(Number.isFinite(preSleep) && preSleep > 0, `preStop sleeps ${preSleep} s`,
  "preStop must be a sleep (exec: [sleep, N]) that lets the endpoint removal spread");
const drainS = (config?.drain_timeout_ms ?? 30000) / 1000;
const grace = pod.terminationGracePeriodSeconds ?? 30;
check(grace > preSleep + drainS,
  `terminationGracePeriodSeconds ${grace} > preStop ${preSleep} s + drain_timeout_ms ${drainS} s`,
  `terminationGracePeriodSeconds ${grace} must exceed preStop ${preSleep} s + drain_timeout_ms ${drainS} s`);

// Security context.
const sc = c.securityContext ?? {};
check((sc.runAsNonRoot ?? pod.securityContext?.runAsNonRoot) === true, "runAsNonRoot");
check(sc.readOnlyRootFilesystem === true, "readOnlyRootFilesystem");
check(sc.allowPrivilegeEscalation === false, "allowPrivilegeEscalation false");
check((sc.capabilities?.drop ?? []).includes("ALL"), "capabilities drop ALL");

// Resources: both set, and the forward pass's threads within the CPU limit.
check(c.resources?.requests?.cpu && c.resources?.limits?.memory, "resources requested and limited");
const cpuLimit = c.resources?.limits?.cpu;
const cpus = typeof cpuLimit === "string" && cpuLimit.endsWith("m")
  ? Number(cpuLimit.slice(0, -1)) / 1000 : Number(cpuLimit);
check(config && config.threads > 0 && config.threads <= Math.max(1, Math.ceil(cpus)),
  `threads ${config?.threads} within the CPU limit ${cpuLimit}`,
  `threads must be set (not 0: that is one per CPU of the node) and within the CPU limit ${cpuLimit}`);

// Prometheus scrape annotations on the pods.
const ann = dep.spec.template.metadata?.annotations ?? {};
check(ann["prometheus.io/scrape"] === "true" && Number(ann["prometheus.io/port"]) === httpPort &&
  ann["prometheus.io/path"] === "/metrics",
  "prometheus.io/scrape, /port and /path point at the http port's /metrics");

// The Service and the disruption budget select the pods and the Service targets the http port.
for (const kind of ["Service", "PodDisruptionBudget"]) {
  for (const o of byKind(kind)) {
    const sel = kind === "Service" ? o.spec.selector : o.spec.selector?.matchLabels;
    check(sel && Object.entries(sel).every(([k, v]) => podLabels[k] === v),
      `${kind} ${o.metadata.name} selects the Deployment's pods`);
  }
}
for (const s of byKind("Service"))
  check(s.spec.ports.every((p) => portOf(p.targetPort ?? p.port) === httpPort),
    `Service ${s.metadata.name} targets the http port`);

finish();

function finish() {
  if (problems.length) {
    for (const p of problems) console.log(`FAIL: ${p}`);
    process.exit(1);
  }
  console.log("k8s: all manifests valid");
  process.exit(0);
}
